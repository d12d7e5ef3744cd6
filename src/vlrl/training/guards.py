"""Stability guards: checks on a step's record that stop a diverging run from wasting GPUs.

Each check is a pure function of the step's values and what came before (the metric history,
the evaluations); it returns a `GuardEvent` when it fires, else None. The trainer runs them in
two phases of a step (`GRPOTrainer.step`):

    update phase  after the update, before the engine gets the new adapter:
                  nonfinite, kl_max, entropy_min, grad_spike
    eval phase    after a periodic holdout evaluation: reward_hacking

and then does what the events ask: `warn` logs, `skip` drops the update (right away, before the
engine sees it), and a `stop` wins over a `rollback` (severity: warn < skip < rollback < stop). The
configuration is `train.guards` (`vlrl.config.GuardsConfig`); docs/observability.md describes
every check, action and where the events go.

Defaults: only `nonfinite` is on (action `stop`), and a healthy step never fires it, so a healthy
run's records, checkpoints and updates are exactly those of a run without guards.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from vlrl.config import GuardsConfig
from vlrl.errors import VlrlError

# Least to most severe: the step does the most severe action among its events.
ACTIONS = ("warn", "skip", "rollback", "stop")
# Checks run right after the update (their `skip` restores the pre-update state).
UPDATE_CHECKS = ("nonfinite", "kl_max", "entropy_min", "grad_spike")
NONFINITE_KEYS = ("reward/mean", "train/loss", "train/grad_norm", "train/kl", "train/entropy")


@dataclass
class GuardEvent:
    """One check that fired at one step: what it saw (`values`) and the action taken."""

    check: str
    action: str
    step: int
    message: str  # the values against the bound, e.g. "train/kl=3.1 > 0.5"
    values: dict[str, float] = field(default_factory=dict)

    @property
    def record_key(self) -> str:
        """The key this event adds to the step's record (value 1.0): `guard/<check>/<action>`."""
        return f"guard/{self.check}/{self.action}"

    def as_dict(self) -> dict[str, Any]:
        """As written to run-events.jsonl: non-finite values as the strings "nan", "inf" (JSON has no NaN)."""
        out = asdict(self)
        out["values"] = {k: v if math.isfinite(v) else str(v) for k, v in self.values.items()}
        return out


class GuardStop(VlrlError):
    """A guard with action `stop` fired: the run was checkpointed and ends (the CLI exits non-zero)."""


def most_severe(events: Iterable[GuardEvent]) -> str | None:
    """The action the step takes: the most severe among its events (None without events)."""
    actions = [e.action for e in events]
    return max(actions, key=ACTIONS.index) if actions else None


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def is_guard_record(record: dict[str, Any]) -> bool:
    """True when a step record carries a guard event (its values are left out of running statistics)."""
    return any(k.startswith("guard/") for k in record)


# -- the checks (pure) ---------------------------------------------------------------------------


def check_nonfinite(values: dict[str, Any]) -> tuple[str, dict[str, float]] | None:
    """NaN or infinite reward, loss, gradient norm, KL or entropy."""
    bad = {k: float(values[k]) for k in NONFINITE_KEYS if k in values and not math.isfinite(float(values[k]))}
    if not bad:
        return None
    return ", ".join(f"{k}={v}" for k, v in bad.items()) + " (not finite)", bad


def check_above(values: dict[str, Any], key: str, bound: float) -> tuple[str, dict[str, float]] | None:
    """`values[key] > bound` (absent or non-finite values are the nonfinite check's business)."""
    value = values.get(key)
    if value is None or not math.isfinite(value) or value <= bound:
        return None
    return f"{key}={_fmt(value)} > {_fmt(bound)}", {key: float(value)}


def check_below(values: dict[str, Any], key: str, bound: float) -> tuple[str, dict[str, float]] | None:
    """`values[key] < bound`."""
    value = values.get(key)
    if value is None or not math.isfinite(value) or value >= bound:
        return None
    return f"{key}={_fmt(value)} < {_fmt(bound)}", {key: float(value)}


def check_grad_spike(
    values: dict[str, Any], history: list[dict[str, Any]], factor: float, window: int, min_steps: int
) -> tuple[str, dict[str, float]] | None:
    """train/grad_norm above `factor` x the median of the last `window` finite norms of steps
    without guard events (at least `min_steps` of them, and a median above zero)."""
    value = values.get("train/grad_norm")
    if value is None or not math.isfinite(value):
        return None
    past = [
        float(r["train/grad_norm"])
        for r in history
        if "train/grad_norm" in r and math.isfinite(float(r["train/grad_norm"])) and not is_guard_record(r)
    ][-window:]
    if len(past) < min_steps:
        return None
    median = statistics.median(past)
    if median <= 0 or value <= factor * median:
        return None
    return (
        f"train/grad_norm={_fmt(value)} > {_fmt(factor)} x median {_fmt(median)} of the last {len(past)} steps",
        {"train/grad_norm": float(value), "median": median},
    )


def _mean_reward(history: list[dict[str, Any]], up_to_step: int, window: int) -> float | None:
    rewards = [
        float(r["reward/mean"])
        for r in history
        if r.get("step", 0) <= up_to_step and "reward/mean" in r and math.isfinite(float(r["reward/mean"]))
    ][-window:]
    return sum(rewards) / len(rewards) if rewards else None


def check_reward_hacking(
    history: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    min_success_drop: float,
    min_reward_gain: float,
    reward_window: int,
) -> tuple[str, dict[str, float]] | None:
    """Holdout success (the latest evaluation) at least `min_success_drop` below the best earlier
    one while the mean train reward of the last `reward_window` steps rose more than
    `min_reward_gain` above its mean at that best evaluation. `history` ends with the latest step."""
    if len(evals) < 2 or not history:
        return None
    now = evals[-1]
    best = max(evals[:-1], key=lambda e: e["success_rate"])  # the earliest best on ties
    drop = best["success_rate"] - now["success_rate"]
    reward_then = _mean_reward(history, best["step"], reward_window)
    reward_now = _mean_reward(history, now["step"], reward_window)
    if (
        drop < min_success_drop
        or reward_then is None
        or reward_now is None
        or reward_now - reward_then <= min_reward_gain
    ):
        return None
    message = (
        f"holdout success {now['success_rate']:.1%} at step {now['step']} < best {best['success_rate']:.1%} at step "
        f"{best['step']} while train reward rose {_fmt(reward_then)} -> {_fmt(reward_now)}"
    )
    return message, {
        "eval/success_rate": now["success_rate"],
        "best_success_rate": best["success_rate"],
        "reward_then": reward_then,
        "reward_now": reward_now,
    }


# -- running them ------------------------------------------------------------------------------


def update_phase_events(
    config: GuardsConfig, step: int, values: dict[str, Any], history: list[dict[str, Any]]
) -> list[GuardEvent]:
    """The update-phase checks that are on and fire for this step's values."""
    results = {
        "nonfinite": lambda: check_nonfinite(values),
        "kl_max": lambda: check_above(values, "train/kl", config.kl_max.bound),
        "entropy_min": lambda: check_below(values, "train/entropy", config.entropy_min.bound),
        "grad_spike": lambda: check_grad_spike(
            values, history, config.grad_spike.factor, config.grad_spike.window, config.grad_spike.min_steps
        ),
    }
    events = []
    for name in UPDATE_CHECKS:
        check = getattr(config, name)
        if check.enabled:
            fired = results[name]()
            if fired is not None:
                events.append(GuardEvent(name, check.action, step, *fired))
    return events


def eval_phase_events(
    config: GuardsConfig, step: int, history: list[dict[str, Any]], evals: list[dict[str, Any]]
) -> list[GuardEvent]:
    """The reward-hacking check after a periodic evaluation (`history` ends with this step)."""
    g = config.reward_hacking
    if not g.enabled:
        return []
    fired = check_reward_hacking(history, evals, g.min_success_drop, g.min_reward_gain, g.reward_window)
    return [GuardEvent("reward_hacking", g.action, step, *fired)] if fired else []


def wants_snapshot(config: GuardsConfig) -> bool:
    """True when an update-phase check may `skip`: the trainer then keeps the pre-update state."""
    return any(getattr(config, name).enabled and getattr(config, name).action == "skip" for name in UPDATE_CHECKS)


def wants_rollback(config: GuardsConfig) -> bool:
    """True when a check may roll back: a fresh run then checkpoints step 0, so there is always one."""
    return any(
        getattr(config, name).enabled and getattr(config, name).action == "rollback"
        for name in (*UPDATE_CHECKS, "reward_hacking")
    )


def withholds_nonfinite(config: GuardsConfig) -> bool:
    """True when the policy must not apply a non-finite gradient (the nonfinite check is on and does more than warn)."""
    return config.nonfinite.enabled and config.nonfinite.action != "warn"


@dataclass
class GuardState:
    """What guards change over a run, kept in checkpoints: the LR scale and the rollbacks done."""

    lr_scale: float = 1.0
    rollbacks: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> GuardState:
        return cls(**(data or {}))
