"""bench/update_memory.py on CPU with the tiny model: both workloads, both loss passes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_bench


def test_update_memory_bench_measures_both_loss_passes_on_both_workloads(tmp_path):
    out = tmp_path / "m.json"
    load_bench("update_memory").main(
        [
            "--model",
            "ci",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--prompts",
            "2",
            "--samples",
            "2",
            "--new-tokens",
            "8",
            "--single-micro",
            "2,4",
            "--multi-micro",
            "2",
            "--multi-impl",
            "legacy,chunked,chunked-ckpt",
            "--turns",
            "2",
            "--turn-tokens",
            "4",
            "--workers",
            "32",
            "--warmup",
            "0",
            "--iters",
            "1",
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    rows = {(r["workload"], r["loss_impl"], r["micro_batch"]): r for r in result["rows"]}
    assert set(rows) == {("single", i, m) for i in ("legacy", "chunked") for m in (2, 4)} | {
        ("multi", i, 2) for i in ("legacy", "chunked", "chunked-ckpt")
    }
    assert all(not r["oom"] and r["update_tokens_per_s"] > 0 for r in rows.values())
    # The multi-turn row is one worker's share of the 6-GPU config's step: 4 optimizer steps, KL on.
    multi = rows[("multi", "chunked", 2)]
    assert (
        multi["optimizer_steps"] == 4
        and multi["kl_coef"] > 0
        and multi["tokens_per_episode"] > 2 * multi["loss_tokens_per_episode"]
    )
    # Both loss passes compute the same loss (the gathered rows are the same numbers).
    for workload, micro, impl in (
        ("single", 2, "chunked"),
        ("single", 4, "chunked"),
        ("multi", 2, "chunked"),
        ("multi", 2, "chunked-ckpt"),
    ):
        legacy, other = rows[(workload, "legacy", micro)]["loss"], rows[(workload, impl, micro)]["loss"]
        assert other == pytest.approx(legacy, rel=1e-4, abs=1e-6)
