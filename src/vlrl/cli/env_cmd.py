"""`vlrl env render|play|split`: look at mazes, play one, list a split.

Examples::

    vlrl env render --size 9 --seed 3 -o maze.png --json     # 225x225 PNG + maze.json
    vlrl env render --layout blocks --size 9 -o maze.png     # the reference block maze, 225x225
    vlrl env play --size 5 --seed 0                          # type up/down/left/right/stop
    vlrl env play --size 5 --seed 0 --oracle                 # watch the BFS oracle solve it
    echo "<answer>down right</answer>" | vlrl env play --plan
    vlrl env split --split holdout --config configs/demo-cpu.yaml
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from vlrl.config import load_config
from vlrl.envs.base import build_split, make_env, split_version
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.envs.maze.maze import LAYOUTS, PLACEMENTS, TRANSFORMS
from vlrl.envs.maze.oracle import distances_to
from vlrl.envs.maze.render import THEMES, ascii_maze, render
from vlrl.envs.maze.splits import adhoc_task, maze_for_task
from vlrl.errors import VlrlError

app = typer.Typer(no_args_is_help=True)
console = Console()


def _check_choice(name: str, value: str, choices) -> None:
    if value not in choices:
        raise VlrlError(f"--{name} {value!r} is not one of: {', '.join(choices)}")


@app.command("render")
def render_cmd(
    size: int = typer.Option(9, "--size", help="Maze size N (N x N cells or blocks, 3-64; blocks: odd, >= 5)."),
    seed: int = typer.Option(3, "--seed", help="Generator seed."),
    layout: str = typer.Option("cells", "--layout", help=f"Maze layout: {', '.join(LAYOUTS)} (blocks = the reference)."),
    cell_px: int = typer.Option(25, "--cell-px", help="Pixels per cell (25: 9x9 -> 225 px)."),
    theme: str = typer.Option("default", "--theme", help=f"Colour theme: {', '.join(THEMES)}."),
    transform: str = typer.Option("none", "--transform", help=f"Geometric transform: {', '.join(TRANSFORMS)}."),
    placement: str = typer.Option("corners", "--placement", help=f"Start/goal placement: {', '.join(PLACEMENTS)}."),
    output: Path = typer.Option(Path("maze.png"), "-o", "--output", help="PNG file to write."),
    write_json: bool = typer.Option(False, "--json", help="Also write the maze JSON next to the PNG (same name, .json)."),
) -> None:
    """Draw one maze with the agent on its start cell and write it as a PNG.

    Example: vlrl env render --size 9 --seed 3 -o maze.png --json
    """
    _check_choice("theme", theme, THEMES)
    _check_choice("transform", transform, TRANSFORMS)
    _check_choice("placement", placement, PLACEMENTS)
    _check_choice("layout", layout, LAYOUTS)
    task = adhoc_task(size, seed, placement=placement, theme=theme, transform=transform, layout=layout)
    maze = maze_for_task(task)
    image = render(maze, maze.start, cell_px, theme, noise_seed=seed if theme == "noise" else None)
    output.parent.mkdir(parents=True, exist_ok=True)
    image.save(output, format="PNG")
    console.print(f"wrote {output} ({image.width}x{image.height} px, start {list(maze.start)}, goal {list(maze.goal)})")
    if write_json:
        json_path = output.with_suffix(".json")
        json_path.write_text(json.dumps(maze.to_json(), indent=1) + "\n")
        console.print(f"wrote {json_path}")


def _read_line() -> str | None:
    """One line of stdin (tty or pipe), None at end of input."""
    line = sys.stdin.readline()
    return None if line == "" else line.strip()


@app.command("play")
def play(
    size: int = typer.Option(5, "--size", help="Maze size N."),
    seed: int = typer.Option(0, "--seed", help="Generator seed."),
    layout: str = typer.Option("cells", "--layout", help=f"Maze layout: {', '.join(LAYOUTS)} (blocks = the reference)."),
    oracle: bool = typer.Option(False, "--oracle", help="Let the BFS oracle play and print each move."),
    plan: bool = typer.Option(False, "--plan", help="Plan variant: answer the whole path in one line."),
    max_turns: int = typer.Option(18, "--max-turns", help="Turn limit of the multi-turn game."),
    stop_required: bool = typer.Option(True, "--stop-required/--no-stop-required", help="Must say stop on the goal."),
) -> None:
    """Play a maze in the terminal, or watch the oracle play it.

    Type one move per line (up, down, left, right, stop), or the whole path with --plan;
    `<action>..</action>` tags are optional. Reads stdin, so piped input works too.
    `q` or end of input quits.

    Example: vlrl env play --size 5 --seed 0 --oracle
    """
    name = "maze_plan" if plan else "maze"
    _check_choice("layout", layout, LAYOUTS)
    try:
        config = MazeEnvConfig(name=name, sizes=[size], layout=layout, max_turns=max_turns, stop_required=stop_required)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        raise VlrlError(f"invalid play settings: {where + ': ' if where else ''}{message}") from None
    env = make_env(config)
    obs = env.reset(adhoc_task(size, seed, env=name, layout=layout))
    maze = env.maze
    console.print(ascii_maze(maze, maze.start), highlight=False)
    console.print(f"[bold]{obs.text}[/]", highlight=False)
    done = False
    while not done:
        if oracle:
            response = env.oracle_response()
            console.print(f"oracle> {response}", highlight=False)
        else:
            console.print("plan> " if plan else "move> ", end="")
            line = _read_line()
            if line is not None and not sys.stdin.isatty():
                console.print(line, highlight=False)  # echo piped input so the transcript reads well
            if line is None or line.lower() in {"q", "quit", "exit"}:
                console.print("\nquit.")
                break
            tag = "answer" if plan else "action"
            response = line if f"<{tag}>" in line.lower() else f"<{tag}>{line}</{tag}>"
        result = env.step(response)
        done = result.done
        console.print(ascii_maze(maze, tuple(result.info["position"])), highlight=False)
        console.print(f"{result.info['feedback']}  (reward {result.reward:+.2f})", highlight=False)
    metrics = env.episode_metrics()
    console.print(
        f"[bold]{'success' if metrics['success'] else 'no success'}[/]: return {metrics['return']:+.2f}, "
        f"{int(metrics['turns'])} turn(s), optimal {int(metrics['optimal_turns'])}, "
        f"{int(metrics['wall_bumps'])} wall bump(s), {int(metrics['invalid_actions'])} invalid"
    )


@app.command("split")
def split_cmd(
    split: str = typer.Option("holdout", "--split", help="train, holdout or adversarial."),
    config: Optional[Path] = typer.Option(None, "--config", help="Run config YAML (default: built-in defaults)."),
    show: int = typer.Option(5, "--show", help="How many of the first tasks to list."),
) -> None:
    """Print a split's size, version and first tasks.

    Example: vlrl env split --split adversarial --config configs/demo-cpu.yaml --show 10
    """
    env_config = load_config(config).env
    tasks = build_split(env_config, split)
    console.print(f"split [bold]{split}[/]: {len(tasks)} tasks, version {split_version(env_config, split)}")
    table = Table("index", "seed", "size", "variant", "start", "goal", "moves")
    for task in tasks[: max(0, show)]:
        maze = maze_for_task(task)
        moves = distances_to(maze, maze.goal)[maze.start[0]][maze.start[1]]
        variant = task.params.get("variant", "-")
        table.add_row(str(task.index), str(task.seed), str(maze.size), variant, str(list(maze.start)), str(list(maze.goal)), str(moves))
    console.print(table)
