"""The `vlrl` command line.

Each command group lives in its own module (`config_cmd`, `env_cmd`, `model_cmd`, `train_cmd`)
and is mounted here. Bad input raises `VlrlError`; `main` prints its one line and exits with 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from vlrl.errors import TimeLimitReached, VlrlError

app = typer.Typer(
    name="vlrl",
    help="Post-train vision-language models with reinforcement learning (GRPO + LoRA), on a laptop or a Ray cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
err_console = Console(stderr=True)


def _mount() -> None:
    # Imported lazily inside a function so that `vlrl --help` stays fast and a broken optional
    # group cannot take the whole CLI down.
    from vlrl.cli import config_cmd, env_cmd, model_cmd, train_cmd

    app.add_typer(config_cmd.app, name="config", help="Show, validate and document run configurations.")
    app.add_typer(env_cmd.app, name="env", help="Render an env's tasks, list splits, play an episode.")
    app.add_typer(model_cmd.app, name="model", help="Build tiny offline models and inspect checkpoints.")
    train_cmd.register(app)
    from vlrl.cli import eval_cmd, jobs_cmd

    eval_cmd.register(app)
    jobs_cmd.register(app)
    from vlrl.cli import bench_cmd

    bench_cmd.register(app)
    from vlrl.cli import lineage_cmd, registry_cmd

    lineage_cmd.register(app)
    app.add_typer(
        registry_cmd.app, name="registry", help="Adapter registry: register, promote through a gate, roll back."
    )
    from vlrl.cli import report_cmd

    report_cmd.register(app)
    from vlrl.cli import serve_cmd

    serve_cmd.register(app)


_mount()


def main() -> None:
    """Entry point of the `vlrl` console script."""
    try:
        app()
    except TimeLimitReached as exc:  # not a failure: the run paused at a checkpoint
        err_console.print(f"[bold yellow]paused:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(TimeLimitReached.exit_code)
    except VlrlError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
