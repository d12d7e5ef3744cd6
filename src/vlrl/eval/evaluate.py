"""Evaluation: play one episode per task with a model (greedy or sampled) and summarise.

The summary is what the protocol compares models on: success rate with a Wilson 95% interval,
turns taken against the oracle's optimum, invalid-action rate, and the same per task group: the
env's `task_group(task)` (the maze: its size, "9x9"; a levelled env: "level 1"), titled by its
`task_group_label`. Every episode's trace (the env's content, actions, rewards) is kept so results
can be re-verified offline.

Each episode row carries its task's key (`task_key`: task id + content hash), so two results on
the same tasks are paired task by task (`pair_results`, McNemar's test in `paired_table`);
summary.json records every task's outcome under `outcomes` for the same reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from vlrl.config import RunConfig
from vlrl.envs.base import Task, task_content_hash, task_group, task_group_label
from vlrl.errors import VlrlError
from vlrl.eval.stats import PairedComparison, Proportion, pair_outcomes
from vlrl.rollout.engine import RolloutEngine, SamplingParams
from vlrl.rollout.episodes import Episode, run_episodes
from vlrl.rollout.sequence import ChatFormat


def task_key(task: Task) -> str:
    """What pairs two models' episodes: the task id and the first 16 hex digits of its content hash
    (the same id over another split version, i.e. another maze, is another key)."""
    return f"{task.task_id}#{task_content_hash(task)[:16]}"


def _natural_key(text: str) -> list:
    """Sort key that orders "9x9" before "11x11" and "level 2" before "level 10"."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part]


def _group_row(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Success with its interval, turns of won episodes against the optimum, invalid-action rate."""
    won = [e for e in episodes if e["success"] > 0]
    turns = sum(e.get("turns", 0.0) for e in episodes)
    p = Proportion(len(won), len(episodes))
    lo, hi = p.interval
    return {
        "n": len(episodes),
        "successes": len(won),
        "success_rate": p.rate,
        "success_low": lo,
        "success_high": hi,
        "mean_turns": turns / max(1, len(episodes)),
        # None (JSON null) when nothing was won: strict JSON readers reject NaN.
        "mean_turns_success": sum(e.get("turns", 0.0) for e in won) / len(won) if won else None,
        "mean_optimal_turns_success": sum(e.get("optimal_turns", 0.0) for e in won) / len(won) if won else None,
        "invalid_rate": sum(e.get("invalid_actions", 0.0) for e in episodes) / max(1.0, turns),
    }


@dataclass
class EvalResult:
    """One model's episodes on one split with one decoding; `meta` says exactly what was evaluated
    (model and adapter fingerprints, split version, task list hash), filled by the protocol."""

    label: str
    split: str
    decoding: str
    episodes: list[dict[str, Any]] = field(default_factory=list)  # metrics + task group per episode
    traces: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def success(self) -> Proportion:
        """Solved episodes out of all, with its Wilson interval."""
        return Proportion(sum(int(e["success"] > 0) for e in self.episodes), len(self.episodes))

    def summary(self) -> dict[str, Any]:
        """Overall and per-task-group figures, plus `meta`; what summary.json holds."""
        by_group: dict[str, list[dict[str, Any]]] = {}
        for e in self.episodes:
            by_group.setdefault(str(e.get("group", "?")), []).append(e)
        groups = sorted(by_group, key=_natural_key)
        rows = {k: _group_row(by_group[k]) for k in groups}
        return {
            "label": self.label,
            "split": self.split,
            "decoding": self.decoding,
            **_group_row(self.episodes),
            "group_label": self.group_label,
            "success_by_group": {k: rows[k]["success_rate"] for k in groups},
            "by_group": rows,
            **self.meta,
        }

    @property
    def group_label(self) -> str:
        """What the task groups are ("maze size", "level"): the env's label, "group" when unknown."""
        envs = {e.get("env") for e in self.episodes}
        if len(envs) != 1 or not isinstance(next(iter(envs)), str):
            return "group"
        try:
            return task_group_label(envs.pop())
        except VlrlError:
            return "group"

    def outcomes(self) -> dict[str, bool]:
        """{task key: solved} for every episode, what a paired comparison matches on."""
        missing = [i for i, e in enumerate(self.episodes) if "task_key" not in e]
        if missing:
            raise VlrlError(
                f"result {self.label} has episodes without a task key (e.g. #{missing[0]}); re-run `vlrl eval` "
                "with this version of vlrl to compare it task by task"
            )
        return {e["task_key"]: e["success"] > 0 for e in self.episodes}

    def as_metrics(self, prefix: str) -> dict[str, float]:
        """The summary's top-level numbers as {prefix/name: value}."""
        s = self.summary()
        return {
            f"{prefix}/{k}": float(v) for k, v in s.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }

    def save(self, out_dir: str | Path) -> Path:
        """Write summary.json and traces.jsonl (one episode trace per line)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        summary = self.summary()
        if all("task_key" in e for e in self.episodes):
            summary["outcomes"] = {k: int(v) for k, v in self.outcomes().items()}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        with (out / "traces.jsonl").open("w") as f:
            for t in self.traces:
                f.write(json.dumps(t) + "\n")
        return out


def episode_row(metrics: dict[str, float], task: Task) -> dict[str, Any]:
    """One episode of an `EvalResult`: its metrics, env, task group and task key."""
    return {**metrics, "env": task.env, "group": task_group(task), "task_id": task.task_id, "task_key": task_key(task)}


def result_from_episodes(episodes: list[Episode], label: str, split: str, decoding: str) -> EvalResult:
    rows = [episode_row(e.metrics, e.task) for e in episodes]
    return EvalResult(label, split, decoding, rows, [e.trace for e in episodes])


def evaluate_engine(
    engine: RolloutEngine,
    chat: ChatFormat,
    config: RunConfig,
    tasks: list[Task],
    *,
    greedy: bool,
    label: str,
    seed: int = 0,
) -> EvalResult:
    """One episode per task; greedy decoding, or sampling at the rollout temperature."""
    r = config.rollout
    params = SamplingParams(
        temperature=0.0 if greedy else r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens, seed=seed
    )
    episodes = run_episodes(engine, chat, config.env, tasks, 1, params, r.max_model_len)
    split = tasks[0].split if tasks else "?"
    return result_from_episodes(episodes, label, split, "greedy" if greedy else f"sampled T={r.temperature}")


def _turns(row: dict[str, Any]) -> str:
    if row["mean_turns_success"] is None:  # nothing won
        return "-"
    return f"{row['mean_turns_success']:.2f} / {row['mean_optimal_turns_success']:.2f}"


def _group_label(results: list[EvalResult]) -> str:
    labels = {r.group_label for r in results}
    return labels.pop() if len(labels) == 1 else "group"


def results_table(results: list[EvalResult], title: str = "evaluation") -> Table:
    """Models side by side: success with its 95% interval, turns against the optimum, invalid rate."""
    table = Table(title=title)
    for col in (
        "model",
        "split",
        "decoding",
        "n",
        "success [95% CI]",
        "turns (won) / optimal",
        "invalid",
        f"by {_group_label(results)}",
    ):
        table.add_column(col)
    for r in results:
        s = r.summary()
        groups = " ".join(f"{k}:{v:.0%}" for k, v in s["success_by_group"].items())
        table.add_row(
            r.label, r.split, r.decoding, str(s["n"]), r.success.format(), _turns(s), f"{s['invalid_rate']:.1%}", groups
        )
    return table


def group_table(results: list[EvalResult], title: str | None = None) -> Table:
    """One row per model, decoding and task group (the maze: size): n, success [95% CI], turns
    (won) / optimal, invalid rate. The title and column say what the groups are ("per maze size")."""
    label = _group_label(results)
    table = Table(title=title or f"per {label}")
    for col in ("model", "decoding", label, "n", "success [95% CI]", "turns (won) / optimal", "invalid"):
        table.add_column(col)
    for r in results:
        for group, row in r.summary()["by_group"].items():
            p = Proportion(row["successes"], row["n"])
            table.add_row(
                r.label, r.decoding, group, str(row["n"]), p.format(), _turns(row), f"{row['invalid_rate']:.1%}"
            )
    return table


def pair_results(a: EvalResult, b: EvalResult) -> PairedComparison:
    """A against B task by task; refused (VlrlError) unless both played the same tasks."""
    return pair_outcomes(a.outcomes(), b.outcomes(), f"{a.label} ({a.decoding})", f"{b.label} ({b.decoding})")


def result_pairs(results: list[EvalResult]) -> list[tuple[EvalResult, EvalResult]]:
    """(later, earlier) for every two results of the same decoding, in the given order: with
    [base, sft, grpo] that is sft vs base, grpo vs base, grpo vs sft."""
    return [(b, a) for i, a in enumerate(results) for b in results[i + 1 :] if a.decoding == b.decoding]


def paired_table(results: list[EvalResult], title: str = "paired comparisons (same tasks)") -> Table:
    """One row per pair of models with the same decoding: discordant tasks, the difference with its
    95% interval (Newcombe, paired) and McNemar's exact two-sided p-value."""
    table = Table(title=title)
    for col in ("A vs B", "decoding", "n", "A only (b)", "B only (c)", "A - B, points [95% CI]", "McNemar p"):
        table.add_column(col)
    for a, b in result_pairs(results):
        pc = pair_results(a, b)
        table.add_row(
            f"{a.label} vs {b.label}",
            a.decoding,
            str(pc.n),
            str(pc.only_a),
            str(pc.only_b),
            pc.format_difference(),
            format_p(pc.p_value),
        )
    return table


def format_p(p: float) -> str:
    """A p-value for a table: 4 significant digits, '<1e-6' below that."""
    return "<1e-6" if p < 1e-6 else f"{p:.4g}"
