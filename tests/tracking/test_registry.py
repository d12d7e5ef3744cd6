"""The adapter registry on real MLflow (SQLite): gated promotion, refusal, rollback, bad input."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from tracking_helpers import copy_db, make_adapter, snapshot, write_eval

from vlrl.errors import VlrlError
from vlrl.models.fingerprint import model_fingerprint
from vlrl.tracking.gate import EvalRecord, promotion_gate
from vlrl.tracking.registry import AdapterRegistry, model_name_for


@pytest.fixture
def setup(tracked_run, reg_config, tmp_path):
    """A registry (a copy of the tracked run's MLflow DB) and the tracked run's real adapter."""
    db = copy_db(tracked_run.db, tmp_path / "runs")
    cfg = reg_config()
    return cfg, AdapterRegistry.from_config(cfg), tracked_run.adapter, db


def evals(tmp_path, cfg, name: str, models: dict, holdout_n: int = 30, adversarial_n: int = 16):
    """`vlrl eval -o` folders for holdout and adversarial: {label: (adapter or None, holdout, adversarial wins)}."""
    out = tmp_path / f"eval-{name}"
    for label, (adapter, h, a) in models.items():
        write_eval(out / "holdout", cfg, label, adapter, "holdout", h, holdout_n)
        write_eval(out / "adversarial", cfg, label, adapter, "adversarial", a, adversarial_n)
    return [out / "holdout", out / "adversarial"]


def test_a_promotion_that_passes_goes_candidate_staging_production_with_an_audit_trail(setup, tmp_path, tracked_run):
    cfg, reg, adapter, _ = setup
    out = reg.register(
        adapter, evals(tmp_path, cfg, "v1", {"base": (None, 2, 2), "grpo": (adapter, 16, 6)}), reason="first GRPO run"
    )
    name = model_name_for("{env}-{base}", "maze", model_fingerprint(cfg.model.path))
    assert (out["name"], out["version"], out["action"]) == (name, 1, "register")
    shown = reg.show(name, "candidate")
    tags = shown["tags"]
    assert shown["run_id"] == tracked_run.run_id == tags["run_id"]  # linked to the training run in MLflow
    assert tags["base_fingerprint"] == model_fingerprint(cfg.model.path) and shown["files"] == "unchanged"
    assert tags["split.train.version"] == tracked_run.lineage["data"]["splits"]["train"]["version"]
    assert (tags["eval.holdout.successes"], tags["eval.holdout.n"]) == ("16", "30")
    assert json.loads(tags["eval.holdout.peers"]) == {"base": [2, 30, 14, 0]}  # successes, n, only grpo, only base

    to_staging = reg.promote(name, 1)
    assert to_staging.passed and to_staging.baseline == "base model"
    assert reg.client.get_registered_model(name).aliases == {"staging": 1}
    to_production = reg.promote(name, 1, "production", reason="holdout +47 points")
    assert to_production.passed
    model = reg.client.get_registered_model(name)
    assert model.aliases == {"production": 1} and json.loads(model.tags["production_history"]) == [1]

    log = reg.history(name)
    assert [(e["action"], e.get("to"), e.get("decision")) for e in log] == [
        ("register", None, None),
        ("promote", "staging", "passed"),
        ("promote", "production", "passed"),
    ]
    last = log[-1]
    assert last["user"] and last["host"] and last["time"] and last["reason"] == "holdout +47 points"
    numbers = {c["name"]: c["numbers"] for c in last["gate"]["checks"]}
    assert (
        numbers["holdout_margin"]["candidate"]["successes"] == 16
        and numbers["holdout_margin"]["baseline"]["successes"] == 2
    )
    # McNemar: 14 tasks only the candidate solved, none only the base: p = 2 / 2^14
    assert (numbers["holdout_paired_test"]["b"], numbers["holdout_paired_test"]["c"]) == (14, 0)
    assert (
        abs(numbers["holdout_paired_test"]["p_value"] - 2 / 2**14) < 1e-12 and last["settings"]["max_p_value"] == 0.05
    )
    assert json.loads(reg.show(name, 1)["tags"]["gate.production"])["decision"] == "passed"

    # the same weights saved by another run (a GRPO run that changed nothing): no new version, the
    # version keeps its own lineage, only its evaluations are updated
    twin = shutil.copytree(adapter, tmp_path / "twin-run" / "adapter")
    again = reg.register(twin, evals(tmp_path, cfg, "twin", {"base": (None, 2, 2), "twin": (twin, 17, 6)}))
    assert (again["action"], again["version"], again["source"]) == ("update-evals", 1, str(adapter.resolve()))
    tags_after = reg.show(name, 1)["tags"]
    assert tags_after["adapter_path"] == tags["adapter_path"] and tags_after["run_id"] == tags["run_id"]
    assert tags_after["eval.holdout.successes"] == "17"


def promote_to_production(reg, name, version):
    assert reg.promote(name, version).passed
    assert reg.promote(name, version, "production").passed


def test_a_promotion_that_is_refused_changes_no_stage(setup, tmp_path, reg_config):
    cfg, reg, adapter, _ = setup
    name = reg.register(adapter, evals(tmp_path, cfg, "v1", {"base": (None, 2, 2), "grpo": (adapter, 16, 6)}))["name"]
    promote_to_production(reg, name, 1)
    # v2 evaluated in the same run as production v1: 18/30 vs 16/30 clears the margin, but only 2 tasks are
    # discordant (b=2, c=0: McNemar p = 0.5), and adversarial success falls by 25 points
    v2 = make_adapter(cfg, tmp_path / "run2" / "adapter", seed=2)
    reg.register(v2, evals(tmp_path, cfg, "v2", {"v1": (adapter, 16, 6), "v2": (v2, 18, 2)}))
    before = snapshot(reg)
    decision = reg.promote(name, 2)
    assert not decision.passed and decision.baseline == "production v1"
    failed = {c.name for c in decision.checks if not c.passed}
    assert failed == {"holdout_paired_test", "adversarial_drop"}
    assert "McNemar p = 0.5 >= 0.05" in decision.reasons() and "beyond the allowed drop" in decision.reasons()
    after = snapshot(reg)
    assert after[name]["aliases"] == before[name]["aliases"] == {"production": 1, "candidate": 2}
    assert json.loads(after[name]["versions"]["2"]["gate.staging"])["decision"] == "refused"
    assert reg.history(name)[-1]["decision"] == "refused"

    # evaluated on other tasks than production: refused with instructions, not compared
    v3 = make_adapter(cfg, tmp_path / "run3" / "adapter", seed=3)
    reg.register(v3, evals(tmp_path, cfg, "v3", {"v3": (v3, 20, 6)}, holdout_n=20))
    decision = reg.promote(name, 3)
    assert not decision.passed and "different tasks" in decision.reasons()


def test_rollback_restores_the_previous_production_version(setup, tmp_path):
    cfg, reg, adapter, _ = setup
    name = reg.register(adapter, evals(tmp_path, cfg, "v1", {"base": (None, 2, 2), "grpo": (adapter, 16, 6)}))["name"]
    promote_to_production(reg, name, 1)
    v2 = make_adapter(cfg, tmp_path / "run2" / "adapter", seed=2)
    # v2 has no peer entry for v1: the gate uses v1's own stored evaluation (same split, tasks, decoding)
    reg.register(v2, evals(tmp_path, cfg, "v2", {"v2": (v2, 29, 6)}))
    promote_to_production(reg, name, 2)
    # ... paired task by task through the two versions' summary files: 13 only v2 solved, none only v1
    paired = {c["name"]: c["numbers"] for c in reg.history(name)[-1]["gate"]["checks"]}["holdout_paired_test"]
    assert (paired["b"], paired["c"]) == (13, 0)
    model = reg.client.get_registered_model(name)
    assert model.aliases == {"production": 2} and json.loads(model.tags["production_history"]) == [1, 2]

    out = reg.rollback(name, reason="serving regression")
    assert (out["from"], out["to"]) == (2, 1)
    model = reg.client.get_registered_model(name)
    assert model.aliases == {"production": 1} and json.loads(model.tags["production_history"]) == [1]
    assert json.loads(reg.show(name, 2)["tags"]["rolled_back"])["to"] == 1
    assert reg.history(name)[-1]["action"] == "rollback"
    before = snapshot(reg)
    with pytest.raises(VlrlError, match="nothing to roll back to"):
        reg.rollback(name)
    assert snapshot(reg) == before


def test_bad_input_is_one_clear_error_and_leaves_the_registry_unchanged(setup, tmp_path, reg_config):
    cfg, reg, adapter, db = setup
    name = reg.register(adapter, evals(tmp_path, cfg, "v1", {"base": (None, 2, 2), "grpo": (adapter, 16, 6)}))["name"]
    other_base = make_adapter(cfg, tmp_path / "other" / "adapter", seed=4, base_fingerprint="sha256:" + "ab" * 32)
    before = snapshot(reg)
    audit_lines = len(reg.history())
    cases = [
        (lambda: reg.promote("maze-nope", 1), "no registered model 'maze-nope'"),
        (lambda: reg.promote(name, 9), "has no version 9; versions: 1"),
        (lambda: reg.promote(name, 1, "production"), "not in staging"),
        (lambda: reg.rollback(name), "no production version"),
        (lambda: reg.register(other_base, name=name), "adapters of another base go to another model"),
        (lambda: reg.register(tmp_path / "missing"), "does not exist"),
    ]
    for call, message in cases:
        with pytest.raises(VlrlError, match=message):
            call()
    # a version whose recorded base differs from its model's (a tampered or foreign entry) is never promoted
    reg.client.set_model_version_tag(name, "1", "base_fingerprint", "sha256:" + "cd" * 32)
    with pytest.raises(VlrlError, match="cannot be promoted here"):
        reg.promote(name, 1)
    reg.client.set_model_version_tag(name, "1", "base_fingerprint", before[name]["versions"]["1"]["base_fingerprint"])
    assert snapshot(reg) == before and len(reg.history()) == audit_lines

    # a missing registry database is not silently created
    with pytest.raises(VlrlError, match="does not exist"):
        AdapterRegistry.from_config(cfg, str(tmp_path / "nowhere" / "mlflow.db"))
    assert not (tmp_path / "nowhere").exists()

    # a database locked by another process (an exclusive lock held by another connection)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(VlrlError, match="is locked by another process"):
            AdapterRegistry.from_config(cfg).promote(name, 1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert snapshot(AdapterRegistry.from_config(cfg)) == before


def test_gate_rules_on_numbers():
    def rec(split, s, n, tasks="t", discordant=None):
        return EvalRecord(split, s, n, "greedy", "v", tasks, discordant)

    def decide(c, b, margin=0.02, drop=0.02, max_p=0.05):
        return promotion_gate(
            c,
            b,
            candidate_label="c",
            baseline_label="b",
            holdout_margin=margin,
            max_adversarial_drop=drop,
            max_p_value=max_p,
        )

    # 60/200 vs 20/200 on the same tasks: 45 only the candidate solved, 5 only the baseline
    base = {"holdout": rec("holdout", 20, 200, discordant=(45, 5)), "adversarial": rec("adversarial", 50, 200)}
    assert decide({"holdout": rec("holdout", 60, 200), "adversarial": rec("adversarial", 47, 200)}, base).passed
    # a clear gain refused by a larger margin
    assert not decide(
        {"holdout": rec("holdout", 60, 200), "adversarial": rec("adversarial", 50, 200)}, base, margin=0.25
    ).passed
    # adversarial falls 2.5 points with 2 allowed
    assert not decide({"holdout": rec("holdout", 60, 200), "adversarial": rec("adversarial", 45, 200)}, base).passed
    # no adversarial evaluation at all
    d = decide({"holdout": rec("holdout", 60, 200)}, base)
    assert not d.passed and "no adversarial evaluation" in d.reasons()


def test_gate_decides_on_mcnemar_both_ways():
    def decide(c_wins, b_wins, discordant, max_p=0.05, margin=0.02):
        c = {
            "holdout": EvalRecord("holdout", c_wins, 100, "greedy", "v", "t"),
            "adversarial": EvalRecord("adversarial", 5, 10, "greedy", "v", "t"),
        }
        b = {
            "holdout": EvalRecord("holdout", b_wins, 100, "greedy", "v", "t", discordant),
            "adversarial": EvalRecord("adversarial", 5, 10, "greedy", "v", "t"),
        }
        d = promotion_gate(
            c,
            b,
            candidate_label="c",
            baseline_label="b",
            holdout_margin=margin,
            max_adversarial_drop=0.0,
            max_p_value=max_p,
        )
        return d, {x.name: x for x in d.checks}

    # 58 vs 50 of 100: b = 10, c = 2 -> exact two-sided p = 2 * (1 + 12 + 66) / 4096 = 0.0386
    d, checks = decide(58, 50, (10, 2))
    assert d.passed and abs(checks["holdout_paired_test"].numbers["p_value"] - 79 / 2048) < 1e-12
    # the same gain is not enough at a stricter level
    d, checks = decide(58, 50, (10, 2), max_p=0.01)
    assert not d.passed and "McNemar p = 0.03857 >= 0.01" in d.reasons()
    # the same +8 points from more discordant tasks is luck (b = 24, c = 16: p = 0.268)
    d, checks = decide(58, 50, (24, 16))
    assert not d.passed and not checks["holdout_paired_test"].passed and checks["holdout_margin"].passed
    # significant, but in the wrong direction: the baseline solved the discordant tasks
    d, checks = decide(50, 58, (2, 10), margin=0.0)
    assert not d.passed and "(not better)" in d.reasons()
    # no paired outcomes: refused with what to do
    d, checks = decide(58, 50, None)
    assert not d.passed and "no task-by-task outcomes" in d.reasons()
    # counts that cannot come from these two records are an error, not a decision
    with pytest.raises(VlrlError, match="do not fit"):
        decide(58, 50, (70, 2))
