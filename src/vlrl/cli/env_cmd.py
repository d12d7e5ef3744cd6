"""`vlrl env render|play|split`: look at an env's tasks, play one, list a split. Any registered env.

The env and its settings come from a run config (`-c`, default: the built-in defaults), dotted
overrides and `--env`; the task from `--split`/`--index`, or `--seed` for an ad-hoc task when the
env makes them. Everything goes through the env class (`vlrl.envs.base`). Examples (the maze)::

    vlrl env render --seed 3 'env.sizes=[9]' -o maze.png --json     # 225x225 PNG + the task's trace
    vlrl env render --seed 3 'env.sizes=[9]' env.layout=blocks      # the reference block maze
    vlrl env render --split adversarial --index 2 -o adv.png         # an adversarial task (theme, transform)
    vlrl env play --seed 0                                           # type up/down/left/right/stop
    vlrl env play --seed 0 --oracle                                  # watch the oracle solve it
    echo "down right" | vlrl env play --env maze_plan
    vlrl env split --split holdout -c configs/demo-cpu.yaml
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from vlrl.config import load_config
from vlrl.envs.base import Task, build_split, env_class, make_env, split_version, task_group, task_group_label
from vlrl.envs.config import EnvConfigBase
from vlrl.errors import VlrlError

app = typer.Typer(no_args_is_help=True)
console = Console()

_CONFIG = typer.Option(
    None, "-c", "--config", help="Run config YAML whose env section is used (default: built-in defaults)."
)
_ENV = typer.Option(None, "--env", help="Registered env to use (sets env.name), e.g. maze_plan.")
_SPLIT = typer.Option("holdout", "--split", help="train, holdout or adversarial.")
_INDEX = typer.Option(0, "--index", min=0, help="Task index in the split.")
_SEED = typer.Option(
    None, "--seed", help="An ad-hoc task of this seed instead of a split's task (envs that make them)."
)
_OVERRIDES = typer.Argument(None, help="Dotted overrides of the config, e.g. env.layout=blocks 'env.sizes=[9]'.")


def _env_config(config: Path | None, env: str | None, overrides: list[str] | None) -> EnvConfigBase:
    return load_config(config, [*(overrides or []), *([f"env.name={env}"] if env else [])]).env


def _task(config: EnvConfigBase, split: str, index: int, seed: int | None) -> Task:
    """The ad-hoc task of `seed`, or task `index` of `split`."""
    if seed is not None:
        task = env_class(config.name).adhoc_task(config, seed)
        if task is None:
            raise VlrlError(
                f"env '{config.name}' makes no ad-hoc tasks by seed; pick a split's task with --split and --index"
            )
        return task
    tasks = build_split(config, split)
    if index >= len(tasks):
        raise VlrlError(f"--index {index}: split {split} has {len(tasks)} tasks")
    return tasks[index]


@app.command("render")
def render_cmd(
    config: Path | None = _CONFIG,
    env: str | None = _ENV,
    split: str = _SPLIT,
    index: int = _INDEX,
    seed: int | None = _SEED,
    output: Path = typer.Option(
        Path("task.png"), "-o", "--output", help="PNG file to write (a second image: NAME-1.png, ...)."
    ),
    write_json: bool = typer.Option(
        False, "--json", help="Also write the task's trace at its start (the env's content) next to the PNG."
    ),
    overrides: list[str] | None = _OVERRIDES,
) -> None:
    """Draw a task's first observation and write it as PNG.

    Example: vlrl env render --seed 3 'env.sizes=[9]' -o maze.png --json
    """
    env_config = _env_config(config, env, overrides)
    task = _task(env_config, split, index, seed)
    episode = make_env(env_config)
    obs = episode.reset(task)
    if not obs.images:
        raise VlrlError(f"task {task.task_id}: the first observation has no image (its text: {obs.text!r})")
    output.parent.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(obs.images):
        path = output if i == 0 else output.with_name(f"{output.stem}-{i}{output.suffix}")
        image.save(path, format="PNG")
        console.print(
            f"wrote {path} ({image.width}x{image.height} px, task {task.task_id}, {task_group(task)})", highlight=False
        )
    if write_json:
        json_path = output.with_suffix(".json")
        json_path.write_text(json.dumps(episode.trace(), indent=1) + "\n")
        console.print(f"wrote {json_path}")


def _read_line() -> str | None:
    """One line of stdin (tty or pipe), None at end of input."""
    line = sys.stdin.readline()
    return None if line == "" else line.strip()


def _show(episode, text: str) -> None:
    """The env's text drawing of its state (when it has one), then `text`."""
    drawing = episode.render_text()
    if drawing is not None:
        console.print(drawing, highlight=False)
    console.print(text, highlight=False)


@app.command("play")
def play(
    config: Path | None = _CONFIG,
    env: str | None = _ENV,
    split: str = _SPLIT,
    index: int = _INDEX,
    seed: int | None = _SEED,
    oracle: bool = typer.Option(False, "--oracle", help="Let the env's oracle play and print each response."),
    overrides: list[str] | None = _OVERRIDES,
) -> None:
    """Play a task in the terminal, or watch the oracle play it.

    Type one answer per line (the maze: up, down, left, right, stop; the whole path with
    --env maze_plan); the env puts a bare answer into its response format. Reads stdin, so piped
    input works too. `q` or end of input quits.

    Example: vlrl env play --seed 0 --oracle
    """
    env_config = _env_config(config, env, overrides)
    task = _task(env_config, split, index, seed)
    episode = make_env(env_config)
    obs = episode.reset(task)
    _show(episode, f"[bold]{obs.text}[/]")
    done = False
    while not done:
        if oracle:
            response = episode.oracle_response()
            console.print(f"oracle> {response}", highlight=False)
        else:
            console.print("> ", end="")
            line = _read_line()
            if line is not None and not sys.stdin.isatty():
                console.print(line, highlight=False)  # echo piped input so the transcript reads well
            if line is None or line.lower() in {"q", "quit", "exit"}:
                console.print("\nquit.")
                break
            response = episode.format_response(line)
        result = episode.step(response)
        done = result.done
        feedback = result.observation.text if result.observation is not None else result.info.get("feedback", "")
        _show(episode, f"{feedback}  (reward {result.reward:+.2f})")
    metrics = episode.episode_metrics()
    shown = ", ".join(f"{k} {v:g}" for k, v in metrics.items() if k != "success")
    console.print(f"[bold]{'success' if metrics.get('success') else 'no success'}[/]: {shown}", highlight=False)


@app.command("split")
def split_cmd(
    split: str = _SPLIT,
    config: Path | None = _CONFIG,
    env: str | None = _ENV,
    show: int = typer.Option(5, "--show", help="How many of the first tasks to list."),
    overrides: list[str] | None = _OVERRIDES,
) -> None:
    """Print a split's size, version and first tasks.

    Example: vlrl env split --split adversarial -c configs/demo-cpu.yaml --show 10
    """
    env_config = _env_config(config, env, overrides)
    cls = env_class(env_config.name)
    tasks = build_split(env_config, split)
    version = split_version(env_config, split)
    console.print(f"split [bold]{split}[/] of env {env_config.name}: {len(tasks)} tasks, version {version}")
    rows = []
    for task in tasks[: max(0, show)]:
        extra = cls.describe_task(task)
        rows.append(([str(task.index), str(task.seed), task_group(task)], extra))
    extra_cols = list(dict.fromkeys(k for _, extra in rows for k in extra))
    table = Table("index", "seed", task_group_label(env_config.name), *extra_cols)
    for cells, extra in rows:
        table.add_row(*cells, *(str(extra.get(k, "-")) for k in extra_cols))
    console.print(table)
