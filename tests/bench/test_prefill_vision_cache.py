"""bench/prefill_vision_cache.py on CPU with the tiny model: the cache encodes each image once, same logits."""

from __future__ import annotations

import json

from tests.conftest import load_bench


def test_cached_prefill_encodes_each_image_once_with_the_same_logits(tmp_path):
    bench = load_bench("prefill_vision_cache")
    out = tmp_path / "prefill.json"
    result = bench.main(
        [
            "--model",
            "ci",
            "--episodes",
            "2",
            "--max-turns",
            "4",
            "--model-dir",
            str(tmp_path / "{model}"),
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text())["totals"] == result["totals"]
    uncached, cached = result["per_turn"]["uncached"], result["per_turn"]["cached"]
    assert len(uncached) == len(cached) == 4
    for turn, (u, c) in enumerate(zip(uncached, cached), start=1):
        assert u["images"] == c["images"] == u["encoded"] == 2 * turn  # one image a turn per episode
        assert c["encoded"] == 2 and c["pixel_bytes"] * turn == u["pixel_bytes"]
    assert result["max_abs_logit_diff"] < 1e-4 and result["cache"]["invalidations"] == 0
