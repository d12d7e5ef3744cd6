"""`vlrl config show|validate`: the resolved configuration of a run."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from vlrl.config import config_to_yaml, describe_fields, load_config
from vlrl.envs.base import DEFAULT_ENV, env_config_class

app = typer.Typer(no_args_is_help=True)
console = Console()


@app.command("show")
def show(
    config: Path | None = typer.Argument(None, help="YAML config file (omit for the defaults)."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. algo.group_size=8."),
    doc: bool = typer.Option(False, "--doc", help="Print every field with its type, default and meaning instead."),
    env: str | None = typer.Option(
        None,
        "--env",
        help=(
            "With --doc: list the env.* fields of this registered env (default: the config's env, else the default "
            "env)."
        ),
    ),
) -> None:
    """Print the fully resolved config (file + overrides + defaults).

    Example: vlrl config show configs/demo-cpu.yaml algo.group_size=4
    Example: vlrl config show --doc --env maze_plan
    """
    if doc:
        if env is None:
            env = load_config(config, overrides or []).env.name if config else DEFAULT_ENV
        env_config_class(env)  # an unknown name is one error line with a did-you-mean
        table = Table("key", "type", "default", "meaning", show_lines=False)
        for row in describe_fields(env=env):
            table.add_row(*row)
        console.print(table)
        return
    cfg = load_config(config, overrides or [])
    console.print(Syntax(config_to_yaml(cfg), "yaml", theme="ansi_dark", background_color="default"))


@app.command("validate")
def validate(
    config: Path = typer.Argument(..., help="YAML config file."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. train.steps=5."),
) -> None:
    """Check a config; exit 0 and say so when it is valid, else print the first error and exit 2.

    Example: vlrl config validate configs/qwen3vl-8b-6gpu.yaml
    """
    cfg = load_config(config, overrides or [])
    console.print(
        f"[green]valid[/]: {config} (env {cfg.env.name}, model {cfg.model.path}, "
        f"{cfg.runtime.num_workers} worker(s), group size {cfg.algo.group_size})"
    )
