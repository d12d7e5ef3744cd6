"""bench/per_image_overhead.py on CPU with the tiny model: the batched paths do the same work with fewer calls."""

from __future__ import annotations

from tests.conftest import load_bench


def test_batched_paths_compute_the_same_loss_with_fewer_operators_and_syncs(tmp_path):
    bench = load_bench("per_image_overhead")
    result = bench.main(
        [
            "--model",
            "ci",
            "--episodes",
            "2",
            "--model-dir",
            str(tmp_path / "{model}"),
            "--out",
            str(tmp_path / "overhead.json"),
        ]
    )
    rows = result["rows"]
    assert result["images"] >= 2 * 13  # 9x9 block mazes: at least 12 moves and a stop each
    assert result["same_tokens_both_encodings"] and result["sft_same_loss"] and result["score_same_loss"]
    for phase in ("sft", "score"):
        stock, batched = rows[f"{phase}/stock"], rows[f"{phase}/batched"]
        # transformers' M-RoPE syncs the host several times per image; the batched path a fixed few times
        assert stock["host_syncs"] > 3 * result["images"] > batched["host_syncs"]
        assert batched["aten_ops"] < stock["aten_ops"] / 2
