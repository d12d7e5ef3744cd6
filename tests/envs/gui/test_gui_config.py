"""The gui env's config: configs/gui-cpu.yaml is valid; unknown keys and impossible values are one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlrl.config import load_config
from vlrl.envs.gui.config import GuiEnvConfig
from vlrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
GUI_CPU = ROOT / "configs" / "gui-cpu.yaml"


def test_shipped_config_is_valid():
    config = load_config(GUI_CPU)
    assert isinstance(config.env, GuiEnvConfig)
    assert (config.env.levels, config.env.width, config.env.height) == ([1], 96, 96)


@pytest.mark.parametrize(
    "override, message",
    [
        ("env.levls=[2]", "did you mean 'env.levels'"),
        ("env.levels=[5]", "unknown gui level 5"),
        ("env.levels=[]", "at least one level"),
        ("env.width=100", "multiple of 16"),
        ("env.distractors=[3,1]", "0 <= min <= max"),
        ("env.theme=neon", "unknown gui theme 'neon'"),
        ("env.levels=[4]", "too small for level 4"),
        ("env.rewards.misclick=0.5", "misclick"),
        ("env.adversarial_variants.sizes=[50]", "multiple of 16"),
        ("env.holdout.seed_start=0", "overlap"),
    ],
)
def test_bad_values_are_one_error_line(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(GUI_CPU, [override])
    text = str(err.value)
    assert message in text and "\n" not in text.strip()
