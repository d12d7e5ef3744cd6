"""Stability guards (train.guards): each check on its own, then each fault injected into a real tiny
run (in-process worker; one on Ray) with the configured action shown happening and nothing
written before lost."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from run_compare import same, step_numbers
from typer.testing import CliRunner

from vlrl.config import GuardsConfig, load_config
from vlrl.envs.base import StepResult, register_env
from vlrl.envs.maze.env import MazeEnv
from vlrl.errors import ConfigError
from vlrl.training import guards
from vlrl.training.checkpoint import read_checkpoint, verify
from vlrl.training.guards import GuardStop
from vlrl.training.trainer import GRPOTrainer

ROOT = Path(__file__).resolve().parents[2]
FAST = ["env.max_turns=2", "rollout.max_new_tokens=4", "train.eval_tasks=2", "runtime.torch_threads=1"]

# The fault injection: what the test env's reward and success are (changed between steps).
FAULT: dict = {}


def _healthy_reward(text: str) -> float:
    return float(len(text) % 3)  # varies within a group, so updates have a gradient


@register_env("guard_fault")
class FaultEnv(MazeEnv):
    """One turn per episode; reward `FAULT["reward"](response)`, success `FAULT["success"]`."""

    def step(self, action_text: str) -> StepResult:
        result = super().step(action_text)
        self.success = FAULT.get("success", False)
        return StepResult(None, FAULT.get("reward", _healthy_reward)(action_text), True, result.info)


@pytest.fixture(autouse=True)
def healthy():
    FAULT.clear()
    yield
    FAULT.clear()


@pytest.fixture
def make(ci_model_dir, tmp_path):
    def config(*overrides: str):
        base = [
            f"model.path={ci_model_dir}",
            f"storage.root={tmp_path / 'runs'}",
            "runtime.backend=local",
            "env.name=guard_fault",
            *FAST,
        ]
        return load_config(ROOT / "configs" / "ci-tiny.yaml", base + list(overrides))

    return config


def _trainer(cfg, run_dir) -> GRPOTrainer:
    trainer = GRPOTrainer(cfg, run_dir)
    trainer.setup()
    return trainer


def _state(trainer) -> dict:
    """Adapter, optimizer (every AdamW moment) and scheduler of the (in-process) worker."""
    return {"adapter": trainer.worker.adapter_state(), **trainer.worker.training_state()}


def _same_state(a: dict, b: dict) -> bool:
    def eq(x, y):
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and torch.equal(x, y)
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(eq(u, v) for u, v in zip(x, y))
        return x == y

    return eq(a, b)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the checks, as pure functions ---------------------------------------------------------------


def test_checks_fire_exactly_past_their_bounds():
    assert guards.check_nonfinite({"train/loss": 0.5, "reward/mean": 1.0}) is None
    message, values = guards.check_nonfinite(
        {"train/loss": float("nan"), "train/grad_norm": float("inf"), "reward/mean": 1.0}
    )
    assert message == "train/loss=nan, train/grad_norm=inf (not finite)" and set(values) == {
        "train/loss",
        "train/grad_norm",
    }
    assert guards.check_above({"train/kl": 0.5}, "train/kl", 0.5) is None  # at the bound: fine
    assert guards.check_above({"train/kl": 3.1}, "train/kl", 0.5)[0] == "train/kl=3.1 > 0.5"
    assert guards.check_above({"train/kl": float("nan")}, "train/kl", 0.5) is None  # nonfinite's business
    assert guards.check_below({"train/entropy": 0.01}, "train/entropy", 0.05)[0] == "train/entropy=0.01 < 0.05"
    assert guards.check_below({}, "train/entropy", 0.05) is None


def test_grad_spike_uses_the_running_median_of_healthy_steps():
    past = [{"step": i, "train/grad_norm": g} for i, g in enumerate([1.0, 2.0, 1.5, 100.0, 1.2], 1)]
    past[3]["guard/grad_spike/skip"] = 1.0  # the earlier spike is left out: median of 1, 2, 1.5, 1.2 = 1.35
    message, values = guards.check_grad_spike({"train/grad_norm": 14.0}, past, 10.0, 20, 4)
    assert values["median"] == 1.35 and message.startswith("train/grad_norm=14 > 10 x median 1.35 of the last 4 steps")
    assert guards.check_grad_spike({"train/grad_norm": 13.0}, past, 10.0, 20, 4) is None
    assert guards.check_grad_spike({"train/grad_norm": 14.0}, past, 10.0, 20, 5) is None  # too little history
    assert guards.check_grad_spike({"train/grad_norm": 14.0}, past, 10.0, 2, 2) is not None  # window 2: 1.5, 1.2
    zeros = [{"step": i, "train/grad_norm": 0.0} for i in range(5)]
    assert guards.check_grad_spike({"train/grad_norm": 1.0}, zeros, 10.0, 20, 1) is None  # no scale to judge by


def test_reward_hacking_needs_reward_up_and_holdout_down_together():
    history = [{"step": s, "reward/mean": r} for s, r in enumerate([0.1, 0.2, 0.3, 0.6, 0.8, 0.9], 1)]
    evals = [{"step": 2, "success_rate": 0.5}, {"step": 4, "success_rate": 0.6}, {"step": 6, "success_rate": 0.4}]
    message, values = guards.check_reward_hacking(history, evals, 0.1, 0.0, 2)
    # best evaluation: step 4 (60%), reward mean of steps 3-4 = 0.45; now: steps 5-6 = 0.85
    assert values["best_success_rate"] == 0.6 and values["reward_then"] == pytest.approx(0.45)
    assert "holdout success 40.0% at step 6 < best 60.0% at step 4" in message
    assert guards.check_reward_hacking(history, evals, 0.3, 0.0, 2) is None  # a 20-point drop is not 30
    assert guards.check_reward_hacking(history, evals, 0.1, 0.5, 2) is None  # reward rose 0.4, not more than 0.5
    falling = [{"step": s, "reward/mean": 1.0 - 0.1 * s} for s in range(1, 7)]
    assert guards.check_reward_hacking(falling, evals, 0.1, 0.0, 2) is None  # holdout down, reward down: not hacking
    assert guards.check_reward_hacking(history, evals[:1], 0.1, 0.0, 2) is None


def test_the_most_severe_action_wins():
    event = lambda action: guards.GuardEvent("kl_max", action, 1, "")  # noqa: E731
    assert guards.most_severe([event("warn"), event("stop"), event("skip")]) == "stop"
    assert guards.most_severe([event("skip"), event("rollback")]) == "rollback"
    assert guards.most_severe([]) is None


def test_defaults_only_check_nonfinite():
    g = GuardsConfig()
    assert g.nonfinite.enabled and g.nonfinite.action == "stop"
    assert not any(getattr(g, name).enabled for name in ("kl_max", "entropy_min", "grad_spike", "reward_hacking"))
    assert not guards.wants_snapshot(g) and not guards.wants_rollback(g) and guards.withholds_nonfinite(g)


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "train.guards.kl_max.action=explode",
            "train.guards.kl_max.action = 'explode': Input should be 'warn', 'skip', 'rollback' or 'stop'",
        ),
        ("train.guards.kl_max.bound=-0.5", "train.guards.kl_max.bound = -0.5: Input should be greater than 0"),
        ("train.guards.entropy_min.bound=0", "train.guards.entropy_min.bound = 0: Input should be greater than 0"),
        ("train.guards.grad_spike.factor=0.5", "train.guards.grad_spike.factor = 0.5: Input should be greater than 1"),
        ("train.guards.rollback_lr_factor=2", "train.guards.rollback_lr_factor = 2: Input should be less than 1"),
        (
            "train.guards.reward_hacking.action=skip",
            "train.guards.reward_hacking.action = 'skip': Input should be 'warn', 'rollback' or 'stop'",
        ),
        ("train.guards.kl_maxx.bound=1", "unknown key 'train.guards.kl_maxx'; did you mean 'train.guards.kl_max'?"),
    ],
)
def test_bad_guard_config_is_one_clear_line_and_nothing_is_written(override, expected, ci_model_dir, tmp_path):
    from vlrl.cli import app

    runs = tmp_path / "runs"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "configs/ci-tiny.yaml",
            f"model.path={ci_model_dir}",
            f"storage.root={runs}",
            "runtime.backend=local",
            override,
        ],
    )
    assert isinstance(result.exception, ConfigError)
    message = str(result.exception)
    assert expected in message and "\n" not in message
    assert not runs.exists()


# -- faults injected into real runs ----------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_skip_drops_the_update(bad, make, tmp_path):
    """A reward function returning NaN (the loss stays finite: NaN groups get no advantage) or inf
    (the gradient is NaN: the policy never applies it). `skip`: adapter, AdamW moments and LR
    schedule are exactly those before the step; the next healthy step trains again."""
    cfg = make("train.steps=3", "train.guards.nonfinite.action=skip", "tracking.exporter_port=0")
    trainer = _trainer(cfg, tmp_path / "run")
    trainer.telemetry.start(resumed=False)
    trainer.step()
    before = _state(trainer)
    FAULT["reward"] = lambda text: bad if len(text) % 2 else 1.0
    m = trainer.step()
    assert m.values["guard/nonfinite/skip"] == 1.0 and not math.isfinite(m.values["reward/mean"])
    if bad == float("inf"):
        assert not math.isfinite(m.values["train/grad_norm"])  # the withheld gradient
    assert _same_state(_state(trainer), before)
    FAULT.clear()
    trainer.step()
    assert not _same_state(_state(trainer), before)

    run = tmp_path / "run"
    assert [r["step"] for r in _lines(run / "metrics.jsonl")] == [1, 2, 3]
    (event,) = _lines(run / "run-events.jsonl")
    assert (event["event"], event["check"], event["action"], event["step"]) == ("guard", "nonfinite", "skip", 2)
    assert "reward/mean=" in event["message"]
    scrape = urllib.request.urlopen(trainer.telemetry.exporter.url, timeout=10).read().decode()
    assert 'vlrl_guard_events_total{action="skip",check="nonfinite",run="run"} 1.0' in scrape
    trainer.close()


def test_nonfinite_stop_is_the_default_checkpoints_and_raises_one_line(make, tmp_path):
    """Default guards: a reward function returning inf from step 2 on (NaN gradient) stops the run
    with a checkpoint of that step, whose adapter is step 1's (the gradient was never applied; no
    copy of the state is kept by default); the records and the step-1 checkpoint are intact."""
    cfg = make("train.steps=4", "train.checkpoint_every=1")
    trainer = _trainer(cfg, tmp_path / "run")
    trainer.on_step = lambda m: (
        FAULT.update(reward=lambda text: math.inf if len(text) % 2 else 1.0) if m.step == 1 else None
    )
    with pytest.raises(GuardStop) as stop:
        trainer.train()
    message = str(stop.value)
    assert "\n" not in message and message.startswith(
        "guard nonfinite stopped the run at step 2: reward/mean=inf, train/loss=nan"
    )
    checkpoints = tmp_path / "run" / "checkpoints"
    assert message.endswith(f"(checkpoint {checkpoints / 'step-000002'})")
    assert verify(str(checkpoints / "step-000001")) is None and verify(str(checkpoints / "step-000002")) is None
    first, saved = read_checkpoint(str(checkpoints / "step-000001")), read_checkpoint(str(checkpoints / "step-000002"))
    assert _same_state(first.adapter, saved.adapter) and all(torch.isfinite(v).all() for v in saved.adapter.values())
    assert [r["step"] for r in saved.trainer["history"]] == [1, 2] and "guard/nonfinite/stop" in saved.trainer[
        "history"
    ][-1]
    assert [r["step"] for r in _lines(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
    assert [e["event"] for e in _lines(tmp_path / "run" / "run-events.jsonl")] == ["guard"]
    trainer.close()


def test_cli_stop_exits_non_zero_with_one_error_line(ci_model_dir, tmp_path):
    """`vlrl train` with an entropy floor above reality: exit status 2, one line naming the check
    and its values, and the checkpoint it names is there; with the floor lowered, `--resume auto`
    continues the run."""
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    args = [
        sys.executable,
        "-m",
        "vlrl.cli",
        "train",
        "configs/ci-tiny.yaml",
        f"model.path={ci_model_dir}",
        f"storage.root={runs}",
        "storage.run_name=job",
        "runtime.backend=local",
        *FAST,
        "train.steps=3",
        "train.guards.entropy_min.enabled=true",
        "train.guards.entropy_min.bound=100",
        "--quiet",
    ]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(
        "error: guard entropy_min stopped the run at step 1: train/entropy="
    ), errors
    assert "< 100 (checkpoint " in errors[0]
    assert verify(str(runs / "job" / "checkpoints" / "step-000001")) is None
    assert [r["step"] for r in _lines(runs / "job" / "metrics.jsonl")] == [1]

    # The operator lowers the floor and resumes: a guard setting may change on a resume (recorded).
    from vlrl.cli import app

    resumed = CliRunner().invoke(app, [*args[3:], "train.guards.entropy_min.bound=0.01", "--resume", "auto"])
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in _lines(runs / "job" / "metrics.jsonl")] == [1, 2, 3]
    events = _lines(runs / "job" / "run-events.jsonl")
    assert [e["event"] for e in events] == ["guard", "resume"]
    assert events[1]["changed"] == {"train.guards.entropy_min.bound": [100.0, 0.01]}


def test_rollback_after_a_learning_rate_blow_up(make, tmp_path):
    """lr = 1e6: after step 1's update the KL to the reference jumps at step 2 (0.027 against
    below 0.001 at lr 1e-3 on this tiny model). `rollback`
    goes back to the step-0 checkpoint with lr x 1e-9 (= 1e-3) and the run finishes; the undone
    steps' records are kept aside; the LR scale is in the checkpoints and survives a resume; the
    report lists the event and the rollback."""
    cfg = make(
        "train.steps=3",
        "train.lr=1e6",
        "algo.kl_coef=0.01",
        "train.guards.kl_max.enabled=true",
        "train.guards.kl_max.bound=0.01",
        "train.guards.kl_max.action=rollback",
        "train.guards.rollback_lr_factor=1e-9",
    )
    run = tmp_path / "run"
    trainer = _trainer(cfg, run)
    trainer.train()
    events = _lines(run / "run-events.jsonl")
    assert [(e["event"], e.get("check"), e["step"]) for e in events] == [
        ("guard", "kl_max", 2),
        ("rollback", "kl_max", 0),
    ]
    assert events[0]["values"]["train/kl"] > 0.01 and events[1]["lr_scale"] == 1e-9
    records = _lines(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(
        r["train/lr"] == pytest.approx(1e-3) and r["train/kl"] < 0.01 and not guards.is_guard_record(r) for r in records
    )
    undone = _lines(run / "metrics-rolled-back.jsonl")
    assert [(r["step"], r["rolled_back_by"]) for r in undone] == [(1, "kl_max"), (2, "kl_max")]
    assert undone[0]["train/lr"] == 1e6 and undone[1]["guard/kl_max/rollback"] == 1.0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000000", "step-000003"]
    trainer.close()

    from vlrl.report.html import write_report

    section = write_report(run).read_text().split("<h2>Stability guards</h2>")[1].split("<h2>")[0]
    assert section.count("<tr>") == 3  # the header, the event, the rollback
    assert (
        "<b>rollback</b>" in section and "train/kl=" in section and "rolled back to" in section and "x 1e-09" in section
    )

    resumed = _trainer(cfg, run)
    resumed.load_checkpoint("auto")
    assert resumed.guard_state.lr_scale == 1e-9 and resumed.guard_state.rollbacks == 1
    assert resumed.worker.policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    resumed.close()


def test_rollbacks_beyond_the_limit_stop_the_run(make, tmp_path):
    """The same blow-up with a factor too mild to cure it: one rollback, then a stop."""
    cfg = make(
        "train.steps=4",
        "train.lr=1e6",
        "algo.kl_coef=0.01",
        "train.guards.kl_max.enabled=true",
        "train.guards.kl_max.bound=0.01",
        "train.guards.kl_max.action=rollback",
        "train.guards.max_rollbacks=1",
    )
    trainer = _trainer(cfg, tmp_path / "run")
    with pytest.raises(
        GuardStop,
        match=r"guard kl_max stopped the run at step 2: train/kl=.* > 0.01 \(rollback refused: "
        r"train.guards.max_rollbacks=1 reached\)",
    ):
        trainer.train()
    events = [(e["event"], e.get("action")) for e in _lines(tmp_path / "run" / "run-events.jsonl")]
    assert events == [("guard", "rollback"), ("rollback", None), ("guard", "stop")]
    assert trainer.guard_state.lr_scale == 0.5
    trainer.close()


def test_rollback_without_a_checkpoint_stops(make, tmp_path):
    """Steps driven by hand (no `train`, so no step-0 checkpoint): nothing to roll back to, so the
    rollback becomes a stop, which still writes its checkpoint."""
    cfg = make(
        "train.steps=2",
        "train.guards.entropy_min.enabled=true",
        "train.guards.entropy_min.bound=100",
        "train.guards.entropy_min.action=rollback",
    )
    trainer = _trainer(cfg, tmp_path / "run")
    with pytest.raises(
        GuardStop, match=r"rollback refused: no valid checkpoint to go back to\) \(checkpoint .*step-000001\)$"
    ):
        trainer.step()
    assert trainer.history[-1]["guard/entropy_min/stop"] == 1.0
    assert verify(str(tmp_path / "run" / "checkpoints" / "step-000001")) is None
    trainer.close()


def test_warn_only_logs(make, tmp_path, caplog):
    """An entropy floor above reality with `warn`: every step logs and records the event (also in
    MLflow: a tag and a metric), and the run trains exactly as without the guard."""
    plain = _trainer(make("train.steps=2", "storage.run_name=plain"), tmp_path / "plain")
    for _ in range(2):
        plain.step()
    db = tmp_path / "mlflow.db"
    cfg = make(
        "train.steps=2",
        "train.guards.entropy_min.enabled=true",
        "train.guards.entropy_min.bound=100",
        "train.guards.entropy_min.action=warn",
        "tracking.enabled=true",
        f"tracking.uri=sqlite:///{db}",
    )
    warned = _trainer(cfg, tmp_path / "warned")
    with caplog.at_level(logging.WARNING, logger="vlrl.training"):
        warned.train()
    assert [r.getMessage().split(":")[0] for r in caplog.records if "guard" in r.getMessage()] == [
        "guard entropy_min (warn) at step 1",
        "guard entropy_min (warn) at step 2",
    ]
    assert all(r["guard/entropy_min/warn"] == 1.0 for r in warned.history)
    assert _same_state({"a": plain.worker.adapter_state()}, {"a": warned.worker.adapter_state()})
    strip = lambda h: [{k: v for k, v in r.items() if not k.startswith("guard/")} for r in h]  # noqa: E731
    assert same(step_numbers(strip(plain.history)), step_numbers(strip(warned.history)))

    from vlrl.tracking.store import mlflow_client

    run = mlflow_client(f"sqlite:///{db}").get_run(warned.telemetry.tracker.run_id)
    assert run.data.tags["vlrl.guard.entropy_min"].startswith("warn at step 2: train/entropy=")
    assert run.data.metrics["guard/entropy_min/warn"] == 1.0
    plain.close()
    warned.close()


def test_grad_norm_spike_is_skipped(make, tmp_path):
    """Rewards suddenly 10^4 times larger (Dr. GRPO does not rescale them): the gradient norm
    spikes against the running median and the update is dropped."""
    cfg = make(
        "train.steps=4",
        "algo.advantage=dr_grpo",
        "train.guards.grad_spike.enabled=true",
        "train.guards.grad_spike.min_steps=2",
    )
    trainer = _trainer(cfg, tmp_path / "run")
    trainer.step()
    trainer.step()
    before = _state(trainer)
    FAULT["reward"] = lambda text: 1e4 * _healthy_reward(text)
    m = trainer.step()
    assert m.values["guard/grad_spike/skip"] == 1.0 and _same_state(_state(trainer), before)
    assert m.values["train/grad_norm"] > 10 * max(r["train/grad_norm"] for r in trainer.history[:2])
    trainer.close()


def test_reward_hacking_stops_the_run(make, tmp_path):
    """Train reward climbs while holdout success falls from 100% to 0% (the env's success is
    switched off after step 1): stopped at the evaluation of step 2."""
    cfg = make(
        "train.steps=4",
        "train.eval_every=1",
        "train.guards.reward_hacking.enabled=true",
        "train.guards.reward_hacking.reward_window=1",
    )
    FAULT.update(success=True, reward=lambda text: 0.0)

    def hack(m):
        FAULT.update(success=False, reward=lambda text: 1.0 + _healthy_reward(text))

    trainer = _trainer(cfg, tmp_path / "run")
    trainer.on_step = hack
    with pytest.raises(
        GuardStop,
        match=r"guard reward_hacking stopped the run at step 2: holdout success 0.0% at step 2 "
        r"< best 100.0% at step 1 while train reward rose 0 -> ",
    ):
        trainer.train()
    assert [e["success_rate"] for e in trainer.evals] == [1.0, 0.0]
    trainer.close()


def test_skip_on_ray_leaves_the_actor_state_unchanged(make, tmp_path, monkeypatch):
    """`skip` with the policy in two Ray actors sharded with FSDP2 (the env is the plain maze,
    whose rewards are all 0 for this model, so the fault is an entropy floor above reality): the
    pre-update state is gathered from the shards and put back into them (AdamW's step count
    would read 2 otherwise). Then a NaN gradient under the default guards."""
    ray = pytest.importorskip("ray")
    from vlrl.runtime.cluster import apply_auth_settings

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    apply_auth_settings()
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, object_store_memory=300 * 2**20, include_dashboard=False)
    try:
        cfg = make(
            "env.name=maze",
            "runtime.backend=ray",
            "runtime.num_workers=2",
            "runtime.placement_timeout_s=60",
            "train.steps=3",
            "train.guards.entropy_min.bound=100",
            "train.guards.entropy_min.action=skip",
        )
        trainer = _trainer(cfg, tmp_path / "run")
        initial = _state(trainer)
        trainer.step()  # healthy: the actor's optimizer gets its AdamW state
        before = _state(trainer)
        assert not _same_state(before, initial)
        trainer.config.train.guards.entropy_min.enabled = (
            True  # the driver runs the checks: an entropy floor from now on
        )
        m = trainer.step()
        assert m.values["guard/entropy_min/skip"] == 1.0 and _same_state(_state(trainer), before)

        # A reward function gone wrong (inf, put in where the driver receives the episodes): a NaN
        # gradient on both shards, withheld by both (no copy of the state is kept for this check),
        # and the default `stop` checkpoints the untouched state.
        trainer.config.train.guards.entropy_min.enabled = False
        rollout = trainer.worker.rollout

        def poisoned(*args, **kwargs):
            episodes = rollout(*args, **kwargs)
            for e in episodes[::2]:
                e.turn_rewards[0] = math.inf
            return episodes

        trainer.worker.rollout = poisoned
        with pytest.raises(
            GuardStop, match=r"guard nonfinite stopped the run at step 3: reward/mean=inf, train/loss=nan"
        ):
            trainer.step()
        assert _same_state(_state(trainer), before)
        assert verify(str(tmp_path / "run" / "checkpoints" / "step-000003")) is None
        trainer.close()
    finally:
        ray.shutdown()
