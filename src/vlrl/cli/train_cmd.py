"""`vlrl train`, `vlrl sft` and `vlrl demo`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer
from rich.console import Console

from vlrl.config import RunConfig, load_config

# Job logs and pipes are not terminals: rich would fall back to 80 columns and fold the tables.
console = Console(width=None if sys.stdout.isatty() else 160)


def run_dir_for(config: RunConfig, kind: str) -> Path:
    name = config.storage.run_name or time.strftime(f"{kind}-%Y%m%d-%H%M%S")
    return Path(config.storage.root) / name


def resume_run_dir(config: RunConfig, resume: str | None) -> Path:
    """The run directory of `vlrl train`, checked against --resume before any worker starts.

    No --resume: a new run, refused where checkpoints of a run already are. `auto`: the run
    `storage.run_name` names. A path: the named run (or, without a run name, the run that holds
    the checkpoint). A resume whose config differs in a way that would change the run is refused
    here already (the trainer checks again, with the base weights and the tasks).
    """
    from vlrl.errors import VlrlError
    from vlrl.training.checkpoint import (
        CheckpointStore,
        check_resume_config,
        find_checkpoint,
        read_checkpoint,
        run_dir_of,
    )

    if resume is None:
        run_dir = run_dir_for(config, "grpo")
        done = CheckpointStore(run_dir / "checkpoints").checkpoints()
        if done:
            raise VlrlError(
                f"{run_dir} already holds a run (checkpoint step {done[0][0]}); continue it with --resume auto, "
                "or start a new one under another storage.run_name"
            )
        return run_dir
    if resume == "auto":
        if not config.storage.run_name:
            raise VlrlError(
                "--resume auto continues the run that storage.run_name names; set it (the name the run was "
                "started with)"
            )
        run_dir = run_dir_for(config, "grpo")
        path = find_checkpoint(resume, str(run_dir / "checkpoints"), quiet=True)
    else:
        path = find_checkpoint(resume, "", quiet=True)  # a path names its checkpoints itself
        run_dir = run_dir_for(config, "grpo") if config.storage.run_name else Path(run_dir_of(path))
    if path is not None:
        check_resume_config(read_checkpoint(path).config, config.model_dump(mode="json"), f"from {path}")
    return run_dir


def _show_logs() -> None:
    """vlrl's log lines (resumes, damaged checkpoints, worker restarts) on stderr, once."""
    import logging

    class StderrLines(logging.Handler):
        # The stream is looked up at each line, not kept: tests and tools swap sys.stderr.
        def emit(self, record: logging.LogRecord) -> None:
            print(self.format(record), file=sys.stderr, flush=True)

    logger = logging.getLogger("vlrl.training")  # the trainer's and the checkpoints' lines, at INFO
    if not any(type(h).__name__ == "StderrLines" for h in logger.handlers):
        logger.addHandler(StderrLines())
        logger.setLevel(logging.INFO)


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("sft")(sft)
    app.command("demo")(demo)


def train(
    config: Path = typer.Argument(..., help="YAML run config."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. train.steps=5."),
    init_adapter: Path | None = typer.Option(
        None, "--init-adapter", help="Start from this adapter (e.g. an SFT warm start)."
    ),
    resume: str | None = typer.Option(
        None,
        "--resume",
        help="auto: continue this run (storage.run_name) from its newest valid checkpoint, or start it when it has "
        "none; or a checkpoint directory, a run's checkpoints directory or a run directory.",
    ),
    address: str | None = typer.Option(
        None,
        "--address",
        help="Ray cluster to join (HEAD:6379, ray://HEAD:10001, or auto). Default: RAY_ADDRESS, else a local Ray "
        "instance.",
    ),
    quiet: bool = typer.Option(False, "--quiet", help="One line per step instead of a progress bar (for jobs)."),
) -> None:
    """Train a LoRA adapter with GRPO, on Ray (a local instance unless --address or RAY_ADDRESS names a cluster).

    Example: vlrl train configs/ci-tiny.yaml train.steps=5 storage.run_name=smoke
    Resubmitting the same command with --resume auto continues it from its last checkpoint.
    """
    from vlrl.errors import VlrlError
    from vlrl.training.progress import train_with_progress

    cfg = load_config(config, overrides or [])
    if address:
        if cfg.runtime.backend != "ray":
            raise VlrlError("--address joins a Ray cluster, but runtime.backend is 'local'; drop one of them")
        cfg.runtime.address = address
    if init_adapter is not None and not init_adapter.is_dir():
        raise VlrlError(f"--init-adapter {init_adapter} is not a directory")
    run_dir = resume_run_dir(cfg, resume)
    _show_logs()
    on_ray = cfg.runtime.backend == "ray"
    if on_ray:
        import ray

        was_connected = ray.is_initialized()
    try:
        out = train_with_progress(
            cfg, run_dir, init_adapter=str(init_adapter) if init_adapter else None, resume=resume, quiet=quiet
        )
    finally:
        if on_ray and not was_connected and ray.is_initialized():
            ray.shutdown()  # connected for this run: ends its workers and placement group (a local instance stops)
    console.print(f"adapter written to [bold]{out}[/]")


def sft(
    config: Path = typer.Argument(..., help="YAML run config (train.sft holds the SFT settings)."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. train.sft.episodes=256."),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="New directory for the adapter, or the model with train.sft.mode=full (default: RUN_DIR/sft-adapter).",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace OUT if it already holds files (never the base model)."
    ),
) -> None:
    """Behaviour-clone the BFS oracle into a LoRA adapter (the SFT warm start and baseline).

    OUT must be new or empty (or --overwrite), and never the base model: checked before training.

    Example: vlrl sft configs/demo-cpu.yaml -o runs/sft-adapter
    """
    from rich.progress import Progress

    from vlrl.training.sft import run_sft

    cfg = load_config(config, overrides or [])
    target = out or run_dir_for(cfg, "sft") / "sft-adapter"
    with Progress(console=console, transient=False) as bar:
        task = bar.add_task("SFT", total=None)

        def progress(step: int, total: int, loss: float) -> None:
            bar.update(task, completed=step, total=total, description=f"SFT loss {loss:.3f}")

        path = run_sft(cfg, target, progress, overwrite=overwrite)
    console.print(f"SFT adapter written to [bold]{path}[/]")


def demo(
    config: Path = typer.Option(Path("configs/demo-cpu.yaml"), "--config", "-c", help="Demo config."),
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="Where the demo writes everything."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides."),
) -> None:
    """The embedded demo: tiny model -> SFT warm start -> GRPO -> holdout evaluation table and plot.

    Example: vlrl demo --out runs/demo
    """
    from vlrl.demo import run_demo

    run_demo(load_config(config, overrides or []), out, console)
