"""GRPO against more SFT for the same wall time, on the CPU demo (configs/demo-cpu.yaml).

The demo stops SFT early (at a loss target) and spends most of its minutes on GRPO. Is GRPO
better than simply spending those minutes on SFT? This runs, on one machine and in one process:

1. the demo itself (`vlrl demo`: SFT to the loss target, then GRPO with LoRA), unless --demo-out
   already holds its demo.json;
2. "SFT, long": the same full-weight SFT from the same base, for the demo's SFT + GRPO seconds
   (no loss target, a cosine decay over that budget), so both arms get the same training time;
3. the greedy evaluation of SFT (the demo's start), GRPO and SFT-long on the same holdout mazes,
   each pair compared maze by maze (McNemar).

    PYTHONPATH=src python bench/demo_sft_equal_time.py --out /tmp/sft-equal [--demo-out DIR] [OVERRIDES...]

Writes OUT/sft_equal_time.json (summaries, paired tests, timings) and OUT/eval/ (summary.json and
traces.jsonl per model; `vlrl eval-verify OUT/eval` re-checks them).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console

from vlrl.config import load_config
from vlrl.demo import run_demo
from vlrl.eval.evaluate import pair_results, paired_table, results_table
from vlrl.eval.protocol import evaluate_models
from vlrl.training.sft import run_sft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/demo-cpu.yaml")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--demo-out", type=Path, help="a `vlrl demo` output to reuse (default: OUT/demo, run here)")
    ap.add_argument(
        "--schedule",
        default="cosine",
        choices=["constant", "cosine", "linear"],
        help="SFT-long's learning-rate schedule over its time budget",
    )
    ap.add_argument("overrides", nargs="*", help="dotted overrides for both arms, e.g. train.seed=1")
    args = ap.parse_args()
    console = Console()
    config = load_config(args.config, args.overrides)
    args.out.mkdir(parents=True, exist_ok=True)
    demo_out = args.demo_out or args.out / "demo"
    if not (demo_out / "demo.json").exists():
        run_demo(config, demo_out, console)
    demo = json.loads((demo_out / "demo.json").read_text())
    budget_s = demo["phase_s"]["sft"] + demo["phase_s"]["grpo"]

    # SFT-long: the demo's SFT with its loss target removed and enough episodes that the time
    # budget, not the data, ends it (the demo's 4,096 episodes x 2 epochs are 256 steps).
    long_cfg = config.model_copy(deep=True)
    sft = long_cfg.train.sft
    sft.target_loss, sft.max_minutes, sft.lr_schedule = None, budget_s / 60, args.schedule
    sft.episodes, sft.epochs = 60_000, 1  # 1,875 steps of 32; 2026-12-03's 744-763 s budgets ran ~1,000
    t0 = time.perf_counter()
    long_dir = run_sft(long_cfg, args.out / "sft-long", overwrite=True)
    long_s = round(time.perf_counter() - t0, 1)
    long_steps = len(json.loads((long_dir / "sft_history.json").read_text()))

    sft_dir, grpo_dir = demo_out / "sft-adapter", demo_out / "grpo" / "adapter"
    models = [("sft", str(sft_dir), None), ("grpo", str(sft_dir), str(grpo_dir)), ("sft-long", str(long_dir), None)]
    results = evaluate_models(
        config, models, split="holdout", limit=config.env.holdout.count, greedy=True, out_dir=args.out / "eval"
    )
    console.print(results_table(results, title="holdout, greedy"))
    console.print(paired_table(results, title="paired on the same mazes"))
    by = {r.label: r for r in results}
    pairs = {
        f"{a}_vs_{b}": pair_results(by[a], by[b]).to_json()
        for a, b in (("grpo", "sft"), ("sft-long", "sft"), ("grpo", "sft-long"))
    }
    report = {
        "config": args.config,
        "overrides": args.overrides,
        "demo": {"out": str(demo_out), "phase_s": demo["phase_s"], "sft_steps": demo["sft_steps"]},
        "sft_long": {
            "budget_s": round(budget_s, 1),
            "wall_s": long_s,
            "steps": long_steps,
            "lr_schedule": args.schedule,
        },
        "summaries": {r.label: r.summary() for r in results},
        "paired": pairs,
    }
    (args.out / "sft_equal_time.json").write_text(json.dumps(report, indent=1))
    console.print(f"wrote {args.out / 'sft_equal_time.json'}")


if __name__ == "__main__":
    main()
