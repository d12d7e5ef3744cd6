"""Live progress of a training run in the terminal (rich), or one line per step for jobs.

Both show the same numbers, from the step record the trainer also appends to
RUN_DIR/metrics.jsonl: step, ETA, reward, success, KL, tokens per second and where the step's
time went (generate, env, logprob, optimizer, sync, eval, checkpoint; each only once the
trainer reports it). The ETA is the mean step time of this process times the steps left, so
a resumed run estimates from its own steps, not from the checkpoint's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from vlrl.config import RunConfig
from vlrl.training.trainer import GRPOTrainer, StepMetrics

# (record key, label) of the phases, in the order a step runs them
PHASES = [
    ("time/generate_s", "generate"),
    ("time/env_s", "env"),
    ("time/logprob_s", "logprob"),
    ("time/optim_s", "optim"),
    ("time/sync_s", "sync"),
    ("time/eval_s", "eval"),
    ("time/checkpoint_s", "ckpt"),
]


def format_duration(seconds: float | None) -> str:
    """H:MM:SS (or M:SS), '?' when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class StepClock:
    """ETA from the steps this process has run: mean step time x steps left."""

    def __init__(self, total: int, start_step: int = 0):
        self.total = total
        self.start_step = start_step
        self.started = time.perf_counter()

    def eta(self, step: int) -> float | None:
        """Seconds until `total` steps, or None before the first step of this process."""
        done = step - self.start_step
        if done <= 0:
            return None
        return (time.perf_counter() - self.started) / done * max(0, self.total - step)


def phase_text(values: dict[str, Any]) -> str:
    """'generate 1.2s env 0.1s ...' for the phases present in this step's record."""
    return " ".join(f"{label} {values[key]:.1f}s" for key, label in PHASES if key in values)


def step_line(m: StepMetrics, total: int | None = None, eta: float | None = None) -> str:
    """One line per step (quiet mode, job logs): the numbers of the live display."""
    v = m.values
    step = f"step {m.step}/{total}" if total else f"step {m.step}"
    parts = [
        step,
        f"reward {v.get('reward/mean', 0):.3f}",
        f"success {v.get('episode/success', 0):.1%}",
        f"kl {v.get('train/kl', 0):.4f}",
        f"{v.get('throughput/rollout_tokens_per_s', 0):.0f} tok/s rollout",
        f"{v.get('throughput/train_tokens_per_s', 0):.0f} tok/s train",
        f"step {v.get('time/step_s', 0):.1f}s ({phase_text(v)})",
    ]
    if "eval/success_rate" in v:
        parts.append(
            f"holdout {v['eval/success_rate']:.1%} [{v.get('eval/success_low', 0):.0%}, "
            f"{v.get('eval/success_high', 0):.0%}]"
        )
    if total:
        parts.append(f"eta {format_duration(eta)}")
    return " | ".join(parts)


def step_table(m: StepMetrics | None, eta: float | None, holdout: dict[str, float] | None) -> Table:
    """The live panel under the progress bar: the latest step's numbers."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    if m is None:
        table.add_row("step", "waiting for the first step (rollouts, then the update)")
        return table
    v = m.values
    table.add_row(
        "learning",
        f"reward {v.get('reward/mean', 0):.3f} ± {v.get('reward/std', 0):.3f}   "
        f"success {v.get('episode/success', 0):.1%}   kl {v.get('train/kl', 0):.4f}   "
        f"entropy {v.get('train/entropy', 0):.3f}",
    )
    table.add_row(
        "throughput",
        f"{v.get('throughput/rollout_tokens_per_s', 0):.0f} tok/s rollout   "
        f"{v.get('throughput/train_tokens_per_s', 0):.0f} tok/s train   "
        f"{v.get('throughput/episodes_per_s', 0):.2f} episodes/s",
    )
    table.add_row("time", f"step {v.get('time/step_s', 0):.1f}s: {phase_text(v)}   eta {format_duration(eta)}")
    if holdout:
        table.add_row(
            "holdout",
            f"{holdout['success_rate']:.1%} [{holdout['success_low']:.0%}, {holdout['success_high']:.0%}] "
            f"at step {holdout['step']:.0f}",
        )
    return table


class LiveProgress:
    """The live display: a progress bar and the latest step's numbers (a rich Live).

    with LiveProgress(console, total=100, start_step=0) as live:
        trainer.on_step = live.on_step
    """

    def __init__(self, console: Console, total: int, start_step: int = 0):
        self.clock = StepClock(total, start_step)
        self.bar = Progress(
            TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        )
        self.task = self.bar.add_task("", total=total, completed=start_step)
        self.last: StepMetrics | None = None
        self.holdout: dict[str, float] | None = None
        self.live = Live(self.render(), console=console, refresh_per_second=4)

    def render(self) -> Group:
        eta = self.clock.eta(self.last.step) if self.last else None
        return Group(self.bar, step_table(self.last, eta, self.holdout))

    def on_step(self, m: StepMetrics) -> None:
        """The trainer's per-step callback."""
        self.last = m
        if "eval/success_rate" in m.values:
            self.holdout = {
                "step": m.step,
                **{k: m.values[f"eval/{k}"] for k in ("success_rate", "success_low", "success_high")},
            }
        self.bar.update(self.task, completed=m.step)
        self.live.update(self.render(), refresh=True)

    def __enter__(self) -> LiveProgress:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()


class QuietProgress:
    """One plain line per step (`step_line`), for jobs and pipes."""

    def __init__(self, console: Console, total: int, start_step: int = 0):
        self.console = console
        self.clock = StepClock(total, start_step)

    def on_step(self, m: StepMetrics) -> None:
        """The trainer's per-step callback."""
        self.console.print(step_line(m, self.clock.total, self.clock.eta(m.step)), highlight=False, soft_wrap=True)


def train_with_progress(
    config: RunConfig,
    run_dir: Path,
    init_adapter: str | None = None,
    resume: str | None = None,
    quiet: bool = False,
    console: Console | None = None,
) -> Path:
    """Set up a trainer, optionally resume, train with a progress display; returns the adapter dir.

    `quiet`: one plain line per step (for jobs and pipes) instead of the live display.
    """
    console = console or Console()
    with console.status("loading model and environments"):
        trainer = GRPOTrainer(config, run_dir, init_adapter=init_adapter)
        trainer.setup()
        if resume:
            trainer.load_checkpoint(resume)
    if quiet:
        trainer.on_step = QuietProgress(console, config.train.steps, trainer.step_idx).on_step
        return trainer.train()
    with LiveProgress(console, config.train.steps, trainer.step_idx) as live:
        trainer.on_step = live.on_step
        return trainer.train()
