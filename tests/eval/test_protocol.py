"""The evaluation protocol on the tiny model: tables, traces that re-verify, the train-overlap and
trained-split guards, both decodings, per-size rows, and `vlrl eval` / `vlrl eval-verify`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vlrl.cli import app
from vlrl.envs.base import Task, build_split, replay_trace, split_version
from vlrl.errors import VlrlError
from vlrl.eval.evaluate import group_table, results_table
from vlrl.eval.protocol import check_disjoint_from_train, evaluate_models, tasks_hash
from vlrl.eval.verify import verify_eval_dir
from vlrl.models.fingerprint import model_fingerprint

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def make_adapter(config, out: Path, seed: int = 0) -> Path:
    """A real LoRA adapter on config.model.path with the lineage a training run would give it."""
    from vlrl.models.loading import load_policy_model
    from vlrl.models.lora import apply_lora, save_adapter
    from vlrl.tracking.lineage import collect_lineage, write_adapter_lineage

    peft = apply_lora(load_policy_model(config.model.path), config.model.lora.rank, config.model.lora.alpha, seed=seed)
    save_adapter(peft, out, model_fingerprint(config.model.path))
    write_adapter_lineage(out, collect_lineage(config, out.parent))
    return out


def test_evaluation_saves_traces_that_reverify_the_success_rate(ci_config, tmp_path):
    cfg = ci_config()
    results = evaluate_models(cfg, [("base", None, None)], split="holdout", limit=4, out_dir=tmp_path / "eval")
    summary = results[0].summary()
    assert summary["n"] == 4 and summary["decoding"] == "greedy"
    # what was evaluated, exactly: the model, the split version and the task list
    assert (
        summary["model"]["base_fingerprint"] == model_fingerprint(cfg.model.path)
        and summary["model"]["adapter_path"] is None
    )
    assert summary["split_version"] == split_version(cfg.env, "holdout")
    assert summary["tasks_hash"] == tasks_hash(list(build_split(cfg.env, "holdout"))[:4])
    assert (
        summary["by_group"]["3x3"]["n"] == 4
        and summary["group_label"] == "maze size"
        and summary["successes"] == round(4 * summary["success_rate"])
    )
    assert json.loads((tmp_path / "eval" / "results.json").read_text())[0]["dir"] == "base"

    # The random base wins nothing: its mean turns of won episodes are null, and summary.json is
    # strict JSON (no NaN, which strict readers reject).
    def no_constants(name):
        raise AssertionError(f"{name} in summary.json")

    saved = json.loads((tmp_path / "eval" / "base" / "summary.json").read_text(), parse_constant=no_constants)
    assert (
        saved["successes"] == 0
        and saved["mean_turns_success"] is None
        and saved["by_group"]["3x3"]["mean_optimal_turns_success"] is None
    )
    traces = [json.loads(line) for line in (tmp_path / "eval" / "base" / "traces.jsonl").read_text().splitlines()]
    replays = [replay_trace(t) for t in traces]
    assert all(r["matches"] for r in replays)
    assert sum(r["success"] for r in replays) / len(replays) == summary["success_rate"]
    assert "base" in str(results_table(results).columns[0]._cells)

    # re-verification from the saved files alone, and a tampered trace caught
    (report,) = verify_eval_dir(tmp_path / "eval")
    assert (
        report.ok and report.n == 4 and report.successes_replayed == summary["successes"] and not report.in_train_split
    )
    assert runner.invoke(app, ["eval-verify", str(tmp_path / "eval")]).exit_code == 0
    lines = (tmp_path / "eval" / "base" / "traces.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["success"] = not first["success"]
    (tmp_path / "eval" / "base" / "traces.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    (report,) = verify_eval_dir(tmp_path / "eval")
    assert not report.ok and len(report.mismatched) == 1
    assert runner.invoke(app, ["eval-verify", str(tmp_path / "eval")]).exit_code == 1


def test_holdout_never_overlaps_train_and_a_planted_overlap_is_caught(ci_config):
    cfg = ci_config()
    holdout = list(build_split(cfg.env, "holdout"))
    check_disjoint_from_train(cfg, holdout)
    train_task = build_split(cfg.env, "train")[3]
    planted = Task(train_task.env, "holdout", 999, train_task.seed, dict(train_task.params))
    with pytest.raises(VlrlError, match="also appear in the training split"):
        check_disjoint_from_train(cfg, holdout + [planted])
    # a training layout in disguise (mirrored, another start and goal) is refused too
    from vlrl.envs.maze.splits import maze_for_task

    disguised = Task(train_task.env, "holdout", 998, train_task.seed, {**train_task.params, "transform": "mirror"})
    assert maze_for_task(disguised).content_hash() != maze_for_task(train_task).content_hash()
    with pytest.raises(
        VlrlError, match=r"1 evaluation task\(s\) also appear in the training split \(the same wall layout"
    ):
        check_disjoint_from_train(cfg, holdout + [disguised])


def test_an_adapter_is_refused_on_its_own_training_split_unless_forced(ci_config, tmp_path):
    cfg = ci_config()
    adapter = make_adapter(cfg, tmp_path / "run" / "adapter")
    with pytest.raises(VlrlError, match="was trained on this train split"):
        evaluate_models(cfg, [("a", None, str(adapter))], split="train", limit=2)
    forced = evaluate_models(cfg, [("a", None, str(adapter))], split="train", limit=1, force=True)
    assert forced[0].summary()["model"]["adapter_path"] == str(adapter.resolve())
    # a lineage whose training seeds cover the holdout seeds (another config's train split)
    record = adapter / "vlrl_lineage.json"
    lineage = json.loads(record.read_text())
    lineage["data"]["splits"]["train"].update(seed_start=0, seed_end=10_000_010, version="other")
    record.write_text(json.dumps(lineage))
    with pytest.raises(VlrlError, match="use seeds of adapter a's training split"):
        evaluate_models(cfg, [("a", None, str(adapter))], split="holdout", limit=2)


def test_an_adapter_of_another_base_is_refused_before_any_evaluation(ci_config, tmp_path):
    cfg = ci_config()
    adapter = make_adapter(cfg, tmp_path / "run" / "adapter")
    record = adapter / "vlrl_adapter.json"
    record.write_text(record.read_text().replace(model_fingerprint(cfg.model.path), "sha256:" + "ab" * 32))
    with pytest.raises(VlrlError, match="pass the matching --model"):
        evaluate_models(
            cfg, [("base", None, None), ("a", None, str(adapter))], split="holdout", limit=2, out_dir=tmp_path / "e"
        )
    assert not (tmp_path / "e").exists()


def test_both_decodings_and_a_row_per_maze_size(ci_config, tmp_path):
    cfg = ci_config("env.sizes=[3,4]")
    results = evaluate_models(
        cfg,
        [("base", None, None)],
        split="holdout",
        limit=2,
        decodings=["greedy", "sampled"],
        out_dir=tmp_path / "eval",
    )
    assert [r.decoding for r in results] == ["greedy", f"sampled T={cfg.rollout.temperature}"]
    assert {r.summary()["tasks_hash"] for r in results} == {tasks_hash(list(build_split(cfg.env, "holdout"))[:2])}
    assert set(results[0].summary()["by_group"]) == {"3x3", "4x4"} and len(group_table(results).rows) == 4
    assert (tmp_path / "eval" / "base" / "summary.json").is_file() and (
        tmp_path / "eval" / "base-sampled" / "traces.jsonl"
    ).is_file()


def test_eval_command_prints_the_tables_and_saves_traces(ci_model_dir, tmp_path):
    out = tmp_path / "eval"
    result = runner.invoke(
        app,
        [
            "eval",
            "-c",
            str(ROOT / "configs" / "ci-tiny.yaml"),
            "-n",
            "3",
            "-o",
            str(out),
            f"model.path={ci_model_dir}",
            f"storage.root={tmp_path}",
        ],
    )
    assert result.exit_code == 0, (result.output, result.exception)
    text = " ".join(result.output.split())
    assert "holdout split (3 tasks" in text and "success [95% CI]" in text and "per maze size" in text and "3x3" in text
    assert (out / "base" / "traces.jsonl").is_file() and f"vlrl eval-verify {out}" in text


def test_bad_split_and_missing_adapter_are_clear_errors(ci_config, tmp_path):
    cfg = ci_config()
    with pytest.raises(VlrlError, match="unknown split"):
        evaluate_models(cfg, [("base", None, None)], split="test")
    with pytest.raises(VlrlError, match="is not a directory"):
        evaluate_models(cfg, [("x", None, str(tmp_path / "nope"))], split="holdout", limit=2)
    with pytest.raises(VlrlError, match="unknown decoding"):
        evaluate_models(cfg, [("base", None, None)], split="holdout", decodings=["beam"])


def test_models_are_paired_task_by_task_and_other_task_sets_are_refused(ci_config, tmp_path):
    from vlrl.eval.evaluate import pair_results, paired_table

    cfg = ci_config()
    adapter = make_adapter(cfg, tmp_path / "run" / "adapter", seed=1)
    base, tuned = evaluate_models(
        cfg, [("base", None, None), ("tuned", None, str(adapter))], split="holdout", limit=4, out_dir=tmp_path / "eval"
    )
    (pair,) = json.loads((tmp_path / "eval" / "paired.json").read_text())
    summaries = {r.label: json.loads((tmp_path / "eval" / r.label / "summary.json").read_text()) for r in (base, tuned)}
    assert (
        set(summaries["base"]["outcomes"]) == set(summaries["tuned"]["outcomes"])
        and len(summaries["base"]["outcomes"]) == 4
    )
    assert (pair["a"], pair["b"], pair["n"]) == ("tuned", "base", 4)
    assert pair["only_a"] - pair["only_b"] == summaries["tuned"]["successes"] - summaries["base"]["successes"]
    assert len(paired_table([base, tuned]).rows) == 1
    # pairing follows the task keys, not the order of the episodes
    shuffled = type(base)(base.label, base.split, base.decoding, base.episodes[::-1], [], base.meta)
    assert pair_results(tuned, shuffled) == pair_results(tuned, base)
    # a result over other tasks is refused with one line
    other = evaluate_models(cfg, [("base", None, None)], split="adversarial", limit=4)[0]
    with pytest.raises(
        VlrlError, match="cannot pair tuned .* and base .*: they were evaluated on different tasks"
    ) as err:
        pair_results(tuned, other)
    assert "\n" not in str(err.value)
