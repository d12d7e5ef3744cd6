"""Live progress of a training run in the terminal (rich), or one line per step for jobs."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from vlrl.config import RunConfig
from vlrl.training.trainer import GRPOTrainer, StepMetrics


def step_line(m: StepMetrics) -> str:
    v = m.values
    return (
        f"step {m.step}: reward {v.get('reward/mean', 0):.3f} success {v.get('episode/success', 0):.1%} "
        f"kl {v.get('train/kl', 0):.4f} rollout {v.get('time/rollout_s', 0):.1f}s update {v.get('time/update_s', 0):.1f}s "
        f"{v.get('throughput/rollout_tokens_per_s', 0):.0f} tok/s"
    )


def train_with_progress(config: RunConfig, run_dir: Path, init_adapter: str | None = None, resume: str | None = None,
                        quiet: bool = False, console: Console | None = None) -> Path:
    """Set up a trainer, optionally resume, train with a progress display; returns the adapter dir."""
    console = console or Console()
    with console.status("loading model and environments"):
        trainer = GRPOTrainer(config, run_dir, init_adapter=init_adapter)
        trainer.setup()
        if resume:
            trainer.load_checkpoint(resume)
    if quiet:
        trainer.on_step = lambda m: console.print(step_line(m), highlight=False)
        return trainer.train()
    columns = [TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"),
               TimeRemainingColumn(), TextColumn("{task.description}")]
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("", total=config.train.steps, completed=trainer.step_idx)

        def on_step(m: StepMetrics) -> None:
            v = m.values
            bar.update(task, completed=m.step, description=(
                f"reward {v.get('reward/mean', 0):.2f} success {v.get('episode/success', 0):.0%} "
                f"{v.get('throughput/rollout_tokens_per_s', 0):.0f} tok/s "
                f"rollout {v.get('time/rollout_s', 0):.1f}s update {v.get('time/update_s', 0):.1f}s"))

        trainer.on_step = on_step
        return trainer.train()
