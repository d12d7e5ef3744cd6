"""The demo's whole path on the ci model, kept tiny: SFT on the walker -> GRPO -> evaluation table
(base, the walker itself, demonstrator-SFT, GRPO, paired) -> plot.

The demo's learning target is a benchmark (bench/RESULTS.md), not a test; this checks that every
stage runs and that demo.json reports what the table shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from scipy.stats import binomtest

from vlrl.demo import run_demo


def test_demo_runs_end_to_end_on_tiny_settings(ci_config, tmp_path):
    cfg = ci_config(
        "train.sft.mode=full",
        "train.sft.demonstrator=walker",
        "train.sft.episodes=16",
        "train.sft.batch_size=8",
        "train.steps=2",
        "train.eval_every=1",
        "train.eval_tasks=4",
        "env.holdout.count=8",
    )
    console = Console(record=True, width=160)
    report = run_demo(cfg, tmp_path / "demo", console)
    saved = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert saved["summaries"].keys() == {"base", "demonstrator", "sft", "grpo"} and saved["summaries"]["sft"]["n"] == 8
    assert saved["demonstrator"] == "walker" and saved["summaries"]["demonstrator"]["n"] == 8
    gain = saved["summaries"]["grpo"]["success_rate"] - saved["summaries"]["sft"]["success_rate"]
    assert abs(saved["grpo_minus_sft_pp"] - round(100 * gain, 1)) < 1e-9
    over_walker = saved["summaries"]["grpo"]["success_rate"] - saved["summaries"]["demonstrator"]["success_rate"]
    assert abs(saved["grpo_minus_demonstrator_pp"] - round(100 * over_walker, 1)) < 1e-9
    # the walker's own success on the same 8 holdout tasks, played here without the demo
    from vlrl.envs.base import build_split
    from vlrl.training.sft import play_demonstrator

    holdout = build_split(cfg.env, "holdout")
    walker_wins = sum(play_demonstrator(cfg, holdout[i])["success"] > 0 for i in range(8))
    assert saved["summaries"]["demonstrator"]["successes"] == walker_wins
    assert (tmp_path / "demo" / "learning_curve.png").stat().st_size > 0
    assert report["peak_memory_mb"] > 0 and set(report["phase_s"]) == {"model", "sft", "grpo", "eval"}
    assert report["sft_steps"] == 2  # 16 transcripts in batches of 8, one epoch (ci-tiny.yaml)
    # the paired comparisons agree with the per-model counts: successes(A) - successes(B) = b - c
    s = saved["summaries"]
    assert saved["paired"].keys() == {
        "sft_vs_base",
        "grpo_vs_base",
        "grpo_vs_sft",
        "sft_vs_demonstrator",
        "grpo_vs_demonstrator",
    }
    for key, pair in saved["paired"].items():
        a, b = key.split("_vs_")
        assert pair["n"] == 8 and pair["only_a"] - pair["only_b"] == s[a]["successes"] - s[b]["successes"]
        assert pair["both"] + pair["only_a"] == s[a]["successes"]
        discordant = pair["only_a"] + pair["only_b"]  # McNemar's exact p of these counts (1 when none)
        p = binomtest(pair["only_a"], discordant, 0.5).pvalue if discordant else 1.0
        assert pair["p_value"] == pytest.approx(p, rel=1e-12)
    assert (tmp_path / "demo" / "eval" / "paired.json").is_file()
    text = " ".join(console.export_text().split())
    assert "McNemar p" in text and "grpo vs sft" in text and "grpo vs demonstrator" in text
    assert "GRPO vs its SFT start (SFT on the walker)" in text and "GRPO vs the walker itself" in text


def test_demo_pretrains_the_vision_tower_first_when_asked_and_starts_sft_from_it(ci_config, tmp_path):
    from vlrl.models.fingerprint import model_fingerprint

    cfg = ci_config(
        "train.vision_pretrain.in_demo=true",
        "train.vision_pretrain.steps=2",
        "train.vision_pretrain.tasks=8",
        "train.vision_pretrain.eval_tasks=4",
        "train.vision_pretrain.batch_size=4",
        "train.sft.mode=full",
        "train.sft.episodes=8",
        "train.sft.batch_size=8",
        "train.steps=1",
        "env.holdout.count=4",
    )
    base = cfg.model.path
    report = run_demo(cfg, tmp_path / "demo", Console(record=True, width=160))
    seeing = tmp_path / "demo" / "seeing-model"
    assert set(report["phase_s"]) == {"model", "vision", "sft", "grpo", "eval"}
    assert report["model"] == str(seeing) and model_fingerprint(seeing) != model_fingerprint(base)
    # SFT (full weights) started from the seeing model: its lineage names it as the base it trained
    sft_meta = json.loads((tmp_path / "demo" / "sft-adapter" / "vlrl_sft.json").read_text())
    assert Path(sft_meta["trained_from"]).resolve() == seeing.resolve()
    assert cfg.model.path == base  # the caller's config is not changed
