"""`vlrl model init-tiny` and `vlrl model info`."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from vlrl.cli.model_cmd import app
from vlrl.errors import VlrlError
from vlrl.models import model_fingerprint

runner = CliRunner()


def test_init_tiny_then_info(tmp_path):
    out = tmp_path / "tiny"
    result = runner.invoke(app, ["init-tiny", str(out), "--size", "ci", "--seed", "1"])
    assert result.exit_code == 0, result.output
    fingerprint = model_fingerprint(out)
    assert f"fingerprint: {fingerprint}" in result.output
    assert re.search(r"total parameters\s*│\s*[\d,]+", result.output)

    result = runner.invoke(app, ["info", str(out)])
    assert result.exit_code == 0, result.output
    assert "qwen3_vl" in result.output and fingerprint in result.output
    assert "8 / 2" in result.output  # patch / merge
    assert "256 / 50,176" in result.output  # min / max pixels


def test_errors_surface_as_vlrl_errors(tmp_path):
    result = runner.invoke(app, ["info", str(tmp_path / "nope")])
    assert isinstance(result.exception, VlrlError)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    result = runner.invoke(app, ["init-tiny", str(tmp_path / "full")])
    assert isinstance(result.exception, VlrlError) and "already exists" in str(result.exception)


def test_help_has_examples():
    for command in ("init-tiny", "info", "pretrain-vision"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0 and "Example: vlrl model" in result.output


def test_pretrain_vision_writes_a_new_base_and_says_how_well_it_sees(ci_model_dir, tmp_path):
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "seeing"
    result = runner.invoke(
        app,
        [
            "pretrain-vision",
            str(root / "configs" / "ci-tiny.yaml"),
            "-o",
            str(out),
            f"model.path={ci_model_dir}",
            "env.layout=blocks",
            "env.sizes=[7]",
            "env.cell_px=16",
            "runtime.torch_threads=2",
            "train.vision_pretrain.steps=5",
            "train.vision_pretrain.tasks=16",
            "train.vision_pretrain.eval_tasks=4",
        ],
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"after 5 steps: holdout agent square exact \d+\.\d%", " ".join(result.output.split()))
    assert model_fingerprint(out) != model_fingerprint(ci_model_dir)
    result = runner.invoke(
        app,
        [
            "pretrain-vision",
            str(root / "configs" / "ci-tiny.yaml"),
            "-o",
            str(tmp_path / "x"),
            f"model.path={ci_model_dir}",
            "train.vision_pretrain.stepz=5",
        ],
    )
    assert "stepz" in str(result.exception)
