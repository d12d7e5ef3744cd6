"""Plots of a run (matplotlib, written as PNG): the learning curve with evaluation points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _step_axis(ax) -> None:
    """Whole steps on the x axis, plain numbers on the y axis (no '1e-5+6.84' offsets)."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")


def learning_curve(
    history: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    out_png: str | Path,
    baselines: dict[str, dict[str, Any]] | None = None,
    title: str = "GRPO learning curve",
) -> Path:
    """Training reward and success per step; holdout success with 95% intervals at eval points.

    `baselines` maps a label (e.g. "base", "SFT") to an evaluation summary drawn as a band.
    """
    fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [h["step"] for h in history]
    ax_r.plot(steps, [h.get("reward/mean", float("nan")) for h in history], label="train reward (mean)")
    ax_r.set_xlabel("step")
    ax_r.set_ylabel("reward")
    ax_r.grid(alpha=0.3)
    ax_r.legend(loc="best")
    ax_s.plot(
        steps, [h.get("episode/success", float("nan")) for h in history], alpha=0.6, label="train success (sampled)"
    )
    if evals:
        xs = [e["step"] for e in evals]
        ys = [e["success_rate"] for e in evals]
        err = [[y - e["success_low"] for y, e in zip(ys, evals)], [e["success_high"] - y for y, e in zip(ys, evals)]]
        ax_s.errorbar(xs, ys, yerr=err, fmt="o-", capsize=3, label="holdout success (greedy, 95% CI)")
    for i, (label, s) in enumerate((baselines or {}).items()):
        color = f"C{i + 2}"
        ax_s.axhspan(s["success_low"], s["success_high"], color=color, alpha=0.15)
        ax_s.axhline(s["success_rate"], color=color, ls="--", label=f"{label} holdout ({s['success_rate']:.0%})")
    ax_s.set_ylim(0, 1)
    for ax in (ax_r, ax_s):
        _step_axis(ax)
    ax_s.set_xlabel("step")
    ax_s.set_ylabel("success rate")
    ax_s.grid(alpha=0.3)
    ax_s.legend(loc="best", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# -- the run report's other figures (report/html.py) ------------------------------------------------

# Phases of a step that do not overlap, in the order they run: (record key, label). "update" stands
# for logprob + optimizer when a record has no breakdown; "other" is what the step spent elsewhere.
PHASES = [
    ("time/generate_s", "generate"),
    ("time/env_s", "env"),
    ("time/logprob_s", "logprob"),
    ("time/optim_s", "optimizer"),
    ("time/sync_s", "sync"),
    ("time/eval_s", "eval"),
    ("time/checkpoint_s", "checkpoint"),
]


def phase_seconds(record: dict[str, Any]) -> dict[str, float]:
    """A step record's time split into non-overlapping phases that add up to time/step_s."""
    out = {label: float(record[key]) for key, label in PHASES if key in record}
    if "logprob" not in out and "optimizer" not in out and "time/update_s" in record:
        out = {
            **{k: v for k, v in out.items() if k in ("generate", "env")},
            "update": float(record["time/update_s"]),
            **{k: v for k, v in out.items() if k not in ("generate", "env")},
        }
    if "time/step_s" in record:
        out["other"] = max(0.0, float(record["time/step_s"]) - sum(out.values()))
    return out


def _save(fig, out_png: str | Path) -> Path:
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    rows = [(h["step"], h[key]) for h in history if key in h and h[key] is not None]
    return [r[0] for r in rows], [float(r[1]) for r in rows]


def training_signals(history: list[dict[str, Any]], out_png: str | Path) -> Path:
    """KL, entropy, clip fraction, gradient norm and the sampler/trainer gap per step (2x3)."""
    fig, axes = plt.subplots(2, 3, figsize=(14, 5.5), sharex=True)
    for ax, (key, label) in zip(
        axes.flat,
        [
            ("train/kl", "KL to reference"),
            ("train/entropy", "entropy"),
            ("rollout/logprob_diff_mean", "|trainer - sampler| log-prob, mean"),
            ("train/clip_fraction", "clip fraction"),
            ("train/grad_norm", "gradient norm"),
            ("rollout/kl_sampler_trainer_k3", "KL(sampler || trainer), k3"),
        ],
    ):
        xs, ys = _series(history, key)
        ax.plot(xs, ys, marker="." if len(xs) < 30 else None)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
        _step_axis(ax)
        if not xs:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes, color="gray")
            ax.set_yticks([])
    for ax in axes[1]:
        ax.set_xlabel("step")
    return _save(fig, out_png)


def phase_breakdown(history: list[dict[str, Any]], out_png: str | Path) -> Path:
    """Where each step's time went: stacked bars of the non-overlapping phases."""
    rows = [(h["step"], phase_seconds(h)) for h in history]
    labels = [
        label
        for label in ["generate", "env", "update", *(name for _, name in PHASES[2:]), "other"]
        if any(label in r for _, r in rows)
    ]
    fig, ax = plt.subplots(figsize=(11, 4))
    steps = [s for s, _ in rows]
    bottom = [0.0] * len(rows)
    gaps = [b - a for a, b in zip(steps, steps[1:]) if b > a]
    width = 0.8 * min(gaps) if gaps else 0.8
    for i, label in enumerate(labels):
        values = [r.get(label, 0.0) for _, r in rows]
        ax.bar(
            steps, values, width=width, bottom=bottom, label=label, color=f"C{i}" if label != "other" else "lightgray"
        )
        bottom = [b + v for b, v in zip(bottom, values)]
    _step_axis(ax)
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("time per step, by phase")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _save(fig, out_png)


def throughput(history: list[dict[str, Any]], out_png: str | Path) -> Path:
    """Tokens per second (rollout and train) and episodes per second against wall-clock time."""
    elapsed, t = [], 0.0
    for h in history:
        t += float(h.get("time/step_s", 0.0))
        elapsed.append(t / 60)
    fig, ax = plt.subplots(figsize=(11, 4))
    for key, label in (
        ("throughput/rollout_tokens_per_s", "rollout tokens/s (generation time)"),
        ("throughput/train_tokens_per_s", "train tokens/s (update time)"),
    ):
        pts = [(x, float(h[key])) for x, h in zip(elapsed, history) if key in h]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 30 else None, label=label)
    ax.set_xlabel("wall-clock minutes (sum of step times)")
    ax.set_ylabel("tokens / s")
    ax.grid(alpha=0.3)
    pts = [
        (x, float(h["throughput/episodes_per_s"])) for x, h in zip(elapsed, history) if "throughput/episodes_per_s" in h
    ]
    lines, labels = ax.get_legend_handles_labels()
    if pts:
        ax2 = ax.twinx()
        ax2.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            color="C3",
            ls="--",
            marker="." if len(pts) < 30 else None,
            label="episodes/s (rollout time)",
        )
        ax2.set_ylabel("episodes / s")
        more = ax2.get_legend_handles_labels()
        lines, labels = lines + more[0], labels + more[1]
    if lines:
        ax.legend(lines, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    ax.set_title("throughput over time")
    return _save(fig, out_png)
