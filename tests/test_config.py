"""The typed config: YAML + overrides, clear one-line errors, shipped configs valid."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from vlrl.cli import app
from vlrl.config import config_to_yaml, describe_fields, load_config
from vlrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path, tmp_path):
    cfg = load_config(path)
    resolved = tmp_path / "resolved.yaml"  # jobs and checkpoints carry the resolved config: it loads back the same
    resolved.write_text(config_to_yaml(cfg))
    assert load_config(resolved) == cfg


def test_reference_config_matches_the_topology():
    cfg = load_config(ROOT / "configs" / "qwen3vl-8b-6gpu.yaml")
    assert (cfg.runtime.num_workers, cfg.runtime.use_gpu, cfg.algo.group_size) == (6, True, 8)
    assert cfg.model.lora.rank > 0 and cfg.env.sizes == [9] and cfg.env.cell_px == 25


def test_overrides_are_parsed_as_yaml_and_partial_sections_keep_defaults(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("env:\n  holdout: {seed_start: 50000000}\n")
    cfg = load_config(f, ["algo.group_size=4", "env.sizes=[5, 7]", "rollout.temperature=0.7"])
    assert cfg.algo.group_size == 4 and cfg.env.sizes == [5, 7] and cfg.rollout.temperature == 0.7
    assert cfg.env.holdout.seed_start == 50000000 and cfg.env.holdout.count == 200


def test_yaml_round_trip(tmp_path):
    cfg = load_config(ROOT / "configs" / "ci-tiny.yaml", ["train.steps=3"])
    f = tmp_path / "resolved.yaml"
    f.write_text(config_to_yaml(cfg))
    assert load_config(f) == cfg


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("algo:\n  grup_size: 4\n", "unknown key 'algo.grup_size'; did you mean 'algo.group_size'?"),
        ("modle:\n  path: x\n", "unknown key 'modle'; did you mean 'model'?"),
        ("algo:\n  group_size: 0\n", "algo.group_size = 0"),
        ("algo:\n  group_size: many\n", "algo.group_size = 'many'"),
        ("rollout:\n  max_batch_tokens: 8\n", "rollout.max_batch_tokens = 8"),
        ("rollout:\n  vision_cache_mb: -1\n", "rollout.vision_cache_mb = -1"),
        ("rollout:\n  sleep_unmap: some\n", "rollout.sleep_unmap = 'some': Input should be 'all' or 'large'"),
        ("train:\n  vision_pretrain: {steps: 0}\n", "train.vision_pretrain.steps = 0"),
        ("train:\n  vision_pretrain: {stepz: 5}\n", "unknown key 'train.vision_pretrain.stepz'"),
        ("env:\n  sizes: [2]\n", "maze size 2 is out of range"),
        ("env:\n  holdout: {seed_start: 5}\n", "overlap"),
        ("algo:\n  mini_batch_size: 10\n", "multiple of algo.micro_batch_size"),
        ("algo:\n  step_advantage_weight: 1.0\n  ratio_level: sequence\n", "needs algo.ratio_level 'token'"),
        ("- just\n- a list\n", "top level must be a mapping"),
        ("algo: [unclosed\n", "is not valid YAML"),
    ],
)
def test_bad_config_is_one_clear_line_naming_file_and_key(tmp_path, yaml_text, expected):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml_text)
    with pytest.raises(ConfigError) as err:
        load_config(f)
    message = str(err.value)
    assert expected in message and str(f) in message and "\n" not in message


def test_missing_file_and_bad_override():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("no/such/config.yaml")
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(None, ["algo.group_size"])


def test_every_field_is_documented():
    rows = describe_fields()
    assert len(rows) > 60
    undocumented = [key for key, _, _, doc in rows if not doc.strip()]
    assert not undocumented


def test_cli_show_validate_and_errors(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["config", "show", str(ROOT / "configs" / "ci-tiny.yaml"), "algo.group_size=6"])
    assert r.exit_code == 0 and "group_size: 6" in r.output
    r = runner.invoke(app, ["config", "validate", str(ROOT / "configs" / "qwen3vl-8b-6gpu.yaml")])
    assert r.exit_code == 0 and "valid" in r.output
    r = runner.invoke(app, ["config", "show", "--doc"])
    assert r.exit_code == 0 and "group_size" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  stepz: 3\n")
    r = runner.invoke(app, ["config", "validate", str(bad)])
    assert r.exit_code != 0 and isinstance(r.exception, ConfigError)


def test_console_script_prints_one_error_line(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  grup_size: 4\n")
    proc = subprocess.run(
        [sys.executable, "-m", "vlrl.cli", "config", "validate", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "did you mean 'algo.group_size'" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_tiny_presets_are_one_list():
    """model.init_tiny, the model builder and `vlrl model init-tiny --size` accept the same presets."""
    from typing import get_args

    from vlrl.cli.model_cmd import TinySizeChoice
    from vlrl.config import TinyPreset
    from vlrl.models.tiny import TINY_SPECS

    assert set(get_args(TinyPreset)) == set(TINY_SPECS) == {c.value for c in TinySizeChoice}
