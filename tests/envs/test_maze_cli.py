"""`vlrl env render|play|split` on the maze (the commands know only the env API)."""

from __future__ import annotations

import json

from PIL import Image
from typer.testing import CliRunner

from vlrl.cli.env_cmd import app
from vlrl.envs.maze.maze import Maze

runner = CliRunner()


def test_render_writes_png_and_json(tmp_path):
    out = tmp_path / "maze.png"
    result = runner.invoke(app, ["render", "env.sizes=[9]", "--seed", "3", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert Image.open(out).size == (225, 225) and "9x9" in result.output
    maze = Maze.from_json(json.loads((tmp_path / "maze.json").read_text())["maze"])
    assert maze.size == 9 and maze.seed == 3
    small = tmp_path / "small.png"
    assert runner.invoke(app, ["render", "env.cell_px=16", "--seed", "1", "-o", str(small)]).exit_code == 0
    assert Image.open(small).size == (80, 80)
    # a split's task (the adversarial split draws themes and transforms)
    adv = tmp_path / "adv.png"
    assert runner.invoke(app, ["render", "--split", "adversarial", "--index", "2", "-o", str(adv)]).exit_code == 0
    assert Image.open(adv).size == (125, 125)
    bad = runner.invoke(app, ["render", "--index", "999", "env.holdout.count=3"])
    assert bad.exit_code != 0 and "has 3 tasks" in str(bad.exception)


def test_play_oracle_reaches_the_goal():
    result = runner.invoke(app, ["play", "--seed", "0", "--oracle"])
    assert result.exit_code == 0, result.output
    assert "Stopped on the goal." in result.output and "success:" in result.output
    plan = runner.invoke(app, ["play", "--env", "maze_plan", "--oracle"])
    assert plan.exit_code == 0 and "The path ends on the goal." in plan.output


def test_play_reads_piped_stdin():
    result = runner.invoke(app, ["play", "--seed", "0", "env.max_turns=4"], input="jump\n<action>stop</action>\n")
    assert result.exit_code == 0, result.output
    assert "Invalid action." in result.output and "no success" in result.output
    plan = runner.invoke(app, ["play", "--env", "maze_plan"], input="up up\n")
    assert plan.exit_code == 0 and "The path does not end on the goal." in plan.output
    quit_early = runner.invoke(app, ["play"], input="")
    assert quit_early.exit_code == 0 and "quit" in quit_early.output
    unknown = runner.invoke(app, ["play", "--env", "maze_pla"])
    assert unknown.exit_code != 0 and "did you mean 'maze_plan'" in str(unknown.exception)


def test_split_lists_tasks(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("env:\n  holdout: {seed_start: 10000000, count: 7}\n")
    result = runner.invoke(
        app, ["split", "--split", "holdout", "--config", str(cfg), "--show", "3"], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    assert "7 tasks" in result.output and "version" in result.output
    assert "maze size" in result.output and "moves" in result.output and "5x5" in result.output
