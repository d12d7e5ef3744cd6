"""`vlrl env render|play|split` on the gui env (the commands know only the env API)."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image
from typer.testing import CliRunner

from vlrl.cli.env_cmd import app
from vlrl.envs import replay_trace
from vlrl.envs.gui.app import App

runner = CliRunner()
GUI_CPU = str(Path(__file__).resolve().parents[3] / "configs" / "gui-cpu.yaml")


def test_render_writes_the_screenshot_and_the_app_json(tmp_path):
    out = tmp_path / "l1.png"
    result = runner.invoke(app, ["render", "-c", GUI_CPU, "--seed", "3", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert Image.open(out).size == (96, 96) and "level 1" in result.output
    trace = json.loads((tmp_path / "l1.json").read_text())
    assert App.from_json(trace["app"]).level == 1 and replay_trace(trace)["matches"]
    adv = tmp_path / "adv.png"
    result = runner.invoke(
        app,
        [
            "render",
            "--env",
            "gui",
            "env.levels=[4]",
            "env.width=160",
            "env.height=160",
            "--split",
            "adversarial",
            "--index",
            "3",
            "-o",
            str(adv),
        ],
    )
    assert result.exit_code == 0, result.output
    assert Image.open(adv).size == (192, 192) and "level 4" in result.output  # the resolution variant


def test_play_oracle_solves_a_level_4_app():
    result = runner.invoke(
        app, ["play", "--env", "gui", "env.levels=[4]", "env.width=160", "env.height=160", "--seed", "2", "--oracle"]
    )
    assert result.exit_code == 0, result.output
    assert (
        "Opened the" in result.output and "Stopped: the task is done." in result.output and "success:" in result.output
    )


def test_play_reads_piped_bad_actions():
    result = runner.invoke(
        app,
        ["play", "-c", GUI_CPU, "--seed", "1", "env.stop_required=true", "env.max_turns=8"],
        input='click(12)\ntype(\nclick(300, 5)\ntype("x")\nclick(1, 20)\nstop\n',
    )
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert out.count("Invalid action.") == 2
    assert "click(300, 5) is outside the 96x96 screen." in out and "No text field is focused" in out
    assert "Clicked (1, 20): nothing there." in out and "Stopped, but the task is not done." in out
    assert "invalid_actions 4" in out and "misclicks 1" in out


def test_bad_gui_settings_are_one_line():
    result = runner.invoke(app, ["render", "--env", "gui", "env.levels=[7]"])
    assert (
        result.exit_code != 0
        and "unknown gui level 7" in str(result.exception)
        and "\n" not in str(result.exception).strip()
    )


def test_split_lists_levels_and_variants():
    result = runner.invoke(app, ["split", "--env", "gui", "--split", "adversarial", "--show", "6"])
    assert result.exit_code == 0, result.output
    assert "level 1" in result.output and "moved" in result.output
