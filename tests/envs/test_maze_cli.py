"""`vlrl env render|play|split`."""

from __future__ import annotations

import json

from PIL import Image
from typer.testing import CliRunner

from vlrl.cli.env_cmd import app
from vlrl.envs.maze.maze import Maze

runner = CliRunner()


def test_render_writes_png_and_json(tmp_path):
    out = tmp_path / "maze.png"
    result = runner.invoke(app, ["render", "--size", "9", "--seed", "3", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert Image.open(out).size == (225, 225)
    maze = Maze.from_json(json.loads((tmp_path / "maze.json").read_text()))
    assert maze.size == 9 and maze.seed == 3
    small = tmp_path / "small.png"
    assert runner.invoke(app, ["render", "--size", "5", "--cell-px", "16", "--theme", "dark", "-o", str(small)]).exit_code == 0
    assert Image.open(small).size == (80, 80)


def test_play_oracle_reaches_the_goal():
    result = runner.invoke(app, ["play", "--size", "5", "--seed", "0", "--oracle"])
    assert result.exit_code == 0, result.output
    assert "Stopped on the goal." in result.output and "success:" in result.output
    plan = runner.invoke(app, ["play", "--plan", "--oracle"])
    assert plan.exit_code == 0 and "The path ends on the goal." in plan.output


def test_play_reads_piped_stdin():
    result = runner.invoke(app, ["play", "--size", "3"], input="jump\n<action>stop</action>\n")
    assert result.exit_code == 0, result.output
    assert "Invalid action." in result.output and "no success" in result.output
    quit_early = runner.invoke(app, ["play"], input="")
    assert quit_early.exit_code == 0 and "quit" in quit_early.output


def test_split_lists_tasks(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("env:\n  holdout: {seed_start: 10000000, count: 7}\n")
    result = runner.invoke(app, ["split", "--split", "holdout", "--config", str(cfg), "--show", "3"])
    assert result.exit_code == 0, result.output
    assert "7 tasks" in result.output and "version" in result.output
