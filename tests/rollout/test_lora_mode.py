"""`rollout.lora_mode` resolution and the sampler/trainer drift flag (no vLLM needed)."""

from __future__ import annotations

import logging

import pytest

from vlrl.errors import VlrlError
from vlrl.rollout.lora_mode import logprob_gap_check, resolve_lora_mode, resolve_sleep_level


def test_auto_is_merged_on_gpu_with_vllm_and_adapter_elsewhere():
    assert resolve_lora_mode("auto", "vllm", use_gpu=True) == "merged"
    assert resolve_lora_mode("auto", "vllm", use_gpu=False) == "adapter"
    assert resolve_lora_mode("auto", "transformers", use_gpu=True) == "adapter"
    assert resolve_lora_mode("merged", "vllm", use_gpu=False) == "merged"  # forced
    assert resolve_lora_mode("adapter", "vllm", use_gpu=True) == "adapter"  # forced


def test_merged_with_the_transformers_engine_is_one_line_naming_the_mode_that_works():
    with pytest.raises(VlrlError, match="use rollout.lora_mode=adapter") as err:
        resolve_lora_mode("merged", "transformers", use_gpu=True)
    assert "\n" not in str(err.value)
    with pytest.raises(VlrlError, match="unknown rollout.lora_mode"):
        resolve_lora_mode("fused", "vllm", use_gpu=True)


def test_sleep_level_auto_drops_the_weights_only_where_a_merge_rewrites_them():
    assert resolve_sleep_level("auto", "merged", use_gpu=True) == 2
    assert resolve_sleep_level("auto", "merged", use_gpu=True, world_size=2) == 1  # a group's base is sharded
    assert resolve_sleep_level("auto", "adapter", use_gpu=True) == 1
    assert resolve_sleep_level("auto", "merged", use_gpu=False) == 1  # CPU vLLM has no sleep mode
    assert resolve_sleep_level(1, "merged", use_gpu=True) == 1
    assert resolve_sleep_level(2, "merged", use_gpu=False) == 2  # forced: every sync rewrites every tensor


@pytest.mark.parametrize(
    ("lora_mode", "world_size", "why"), [("adapter", 1, "needs rollout.lora_mode=merged"), ("merged", 4, "not 4")]
)
def test_sleep_level_2_where_nothing_rewrites_the_weights_is_one_line(lora_mode, world_size, why):
    with pytest.raises(VlrlError, match=why) as err:
        resolve_sleep_level(2, lora_mode, use_gpu=True, world_size=world_size)
    assert "\n" not in str(err.value) and "use rollout.sleep_level=1 or auto" in str(err.value)
    with pytest.raises(VlrlError, match="unknown rollout.sleep_level"):
        resolve_sleep_level(3, "merged", use_gpu=True)


def test_a_gap_past_the_tolerance_is_flagged_never_silent(caplog):
    assert logprob_gap_check({}, 0.1) == {}  # a step that measured no gap
    assert logprob_gap_check({"rollout/logprob_diff_mean": 0.01}, 0.1) == {"rollout/logprob_gap_exceeded": 0.0}
    with caplog.at_level(logging.WARNING, logger="vlrl.rollout.lora_mode"):
        out = logprob_gap_check({"rollout/logprob_diff_mean": 0.3, "rollout/logprob_diff_max": 2.0}, 0.1, "merged")
    assert out == {"rollout/logprob_gap_exceeded": 1.0}
    assert "rollout.logprob_gap_tolerance=0.1" in caplog.text and "lora_mode=merged" in caplog.text
    assert logprob_gap_check({"rollout/logprob_diff_mean": float("nan")}, 0.1)["rollout/logprob_gap_exceeded"] == 1.0


def test_the_transformers_worker_refuses_merged(ci_config):
    from vlrl.training.worker import Worker

    with pytest.raises(VlrlError, match="lora_mode=merged needs rollout.engine=vllm"):
        Worker(ci_config("rollout.engine=transformers", "rollout.lora_mode=merged"), total_optimizer_steps=1)
