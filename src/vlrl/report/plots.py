"""Plots of a run (matplotlib, written as PNG): the learning curve with evaluation points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt  # noqa: E402


def learning_curve(history: list[dict[str, Any]], evals: list[dict[str, Any]], out_png: str | Path,
                   baselines: dict[str, dict[str, Any]] | None = None, title: str = "GRPO learning curve") -> Path:
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
    ax_s.plot(steps, [h.get("episode/success", float("nan")) for h in history], alpha=0.6, label="train success (sampled)")
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
