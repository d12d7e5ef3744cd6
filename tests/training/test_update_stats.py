"""Presets of the GRPO family and how update stats add up over micro-batches, workers and steps."""

from __future__ import annotations

import pytest

from vlrl.config import ALGO_PRESETS, AlgoConfig, load_config
from vlrl.errors import ConfigError
from vlrl.runtime.update_plan import combine_update_stats


@pytest.mark.parametrize("name", sorted(ALGO_PRESETS))
def test_a_preset_sets_its_fields_and_explicit_fields_win(name):
    algo = AlgoConfig(preset=name)
    for key, value in ALGO_PRESETS[name].items():
        assert getattr(algo, key) == value, key
    assert AlgoConfig(preset=name, eps_high=0.5).eps_high == 0.5


def test_presets_through_the_config_loader():
    c = load_config(None, ["algo.preset=dr_grpo", "algo.eps_low=0.1"])
    assert (c.algo.advantage, c.algo.loss_agg, c.algo.eps_low) == ("dr_grpo", "seq_mean_token_sum", 0.1)
    assert load_config(None, []).algo.loss_agg == "token_mean"  # no preset: the fields' own defaults
    assert load_config(None, ["algo.preset=gspo"]).algo.eps_high == 4e-4
    with pytest.raises(ConfigError, match="preset"):
        load_config(None, ["algo.preset=ppo"])


def test_extremes_are_extremes_and_the_sampler_gap_is_a_token_mean():
    rank0 = [
        {
            "loss": 1.0,
            "ratio_max": 1.5,
            "ratio_min": 0.9,
            "logprob_diff_max": 0.1,
            "mismatch_abs_sum": 2.0,
            "mismatch_k3_sum": 0.2,
            "mismatch_tokens": 10.0,
        },
        {"loss": 3.0, "ratio_max": 1.1, "ratio_min": 0.5},
    ]
    rank1 = [
        {
            "loss": 1.0,
            "ratio_max": 2.5,
            "ratio_min": 0.95,
            "logprob_diff_max": 0.4,
            "mismatch_abs_sum": 1.0,
            "mismatch_k3_sum": 0.1,
            "mismatch_tokens": 20.0,
        },
        {"loss": 1.0, "ratio_max": 1.0, "ratio_min": 0.8},
    ]
    stats = combine_update_stats([rank0, rank1])
    assert stats["loss"] == 3.0  # (1 + 1 + 3 + 1) / 2 steps
    assert stats["ratio_max"] == 2.5 and stats["ratio_min"] == 0.5 and stats["logprob_diff_max"] == 0.4
    assert stats["logprob_diff_mean"] == pytest.approx(3.0 / 30) and stats["kl_sampler_trainer_k3"] == pytest.approx(
        0.3 / 30
    )
    assert not any(k.startswith("mismatch_") for k in stats)
