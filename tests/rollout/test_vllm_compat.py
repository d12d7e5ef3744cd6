"""The version-dependent part of the vLLM engine that runs without vLLM: the version check and the
GPU memory share next to the policy (both are one-line errors with the numbers)."""

from __future__ import annotations

import logging

import pytest

from vlrl.errors import VlrlError
from vlrl.rollout.factory import POLICY_HEADROOM_BYTES, vllm_memory_share
from vlrl.rollout.vllm_compat import ALLOW_UNSUPPORTED_ENV, check_vllm_version, handles_to_release, parse_version

GIB = 2**30


@pytest.mark.parametrize("version", ["0.24.0", "0.24.1", "0.28.2", "0.32.0+cpu", "0.32.1rc1.dev3"])
def test_supported_versions_pass(version):
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.23.9", "0.33.0", "1.0.0", "0.11.2"])
def test_versions_outside_the_range_are_one_line_naming_both(version, monkeypatch):
    monkeypatch.delenv(ALLOW_UNSUPPORTED_ENV, raising=False)
    with pytest.raises(VlrlError) as info:
        check_vllm_version(version)
    message = str(info.value)
    assert "\n" not in message and f"vLLM {version} is installed" in message and "0.24 through 0.32" in message


def test_an_unsupported_version_can_be_tried_on_purpose(monkeypatch, caplog):
    monkeypatch.setenv(ALLOW_UNSUPPORTED_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="vlrl.rollout.vllm_compat"):
        check_vllm_version("0.40.0")
    assert "trying anyway" in caplog.text


def test_unreadable_version():
    assert parse_version("0.24.0") == (0, 24)
    with pytest.raises(VlrlError, match="cannot read"):
        parse_version("nightly")


def test_memory_share_leaves_room_for_the_policy():
    total = 140 * GIB
    free = 120 * GIB  # 20 GiB taken by the policy
    assert vllm_memory_share(0.5, free, total) == 0.5
    auto = vllm_memory_share("auto", free, total)
    assert auto == pytest.approx((free - POLICY_HEADROOM_BYTES) / total, abs=1e-3)
    with pytest.raises(VlrlError) as info:
        vllm_memory_share(0.9, free, total)
    message = str(info.value)
    assert "\n" not in message and "0.9" in message and "126.0 GiB" in message and "120.0 GiB are free" in message
    with pytest.raises(VlrlError, match="too little"):
        vllm_memory_share("auto", 5 * GIB, total)


def test_config_accepts_auto_and_refuses_out_of_range_shares(ci_config):
    from vlrl.errors import ConfigError

    assert ci_config("rollout.gpu_memory_utilization=auto").rollout.gpu_memory_utilization == "auto"
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        ci_config("rollout.gpu_memory_utilization=1.5")


def test_a_sleep_for_a_rewrite_unmaps_the_kv_cache_and_the_large_weights_without_buffers():
    """What `release_for_rewrite` unmaps (the pure choice; the unmapping itself needs CUDA):
    every KV-cache allocation, a weight allocation from the threshold up, never one that holds a
    buffer (nothing rewrites a rotary table), never a small one or one of another tag."""
    mib = 1 << 20
    handles = [
        (0x1000 * mib, 192 * mib, "weights"),  # an MLP's weights: unmapped
        (0x2000 * mib, 48 * mib, "weights"),  # below the threshold: stays
        (0x3000 * mib, 128 * mib, "weights"),  # holds a buffer at its end: stays
        (0x4000 * mib, 2 * mib, "kv_cache"),  # the KV cache, any size: unmapped
        (0x5000 * mib, 512 * mib, "default"),  # not vLLM's sleep tags: stays
    ]
    buffers = [(0x3000 * mib + 127 * mib, mib), (0x2000 * mib, 4096)]
    assert handles_to_release(handles, buffers, 64 * mib) == [0x1000 * mib, 0x4000 * mib]
    # A buffer right after an allocation does not hold it.
    assert handles_to_release([(0, 64 * mib, "weights")], [(64 * mib, mib)], 64 * mib) == [0]
