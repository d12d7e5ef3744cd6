"""Copy the small outputs of run.sh from /tmp/seeing into this folder: eval summaries, paired JSONs, SFT histories,
arm B curves (step, sampled success of the batch, entropy, wall bumps; in-run evals), wall times per stage.

usage: [W=/tmp/seeingL START=sftL SUBDIR=long SEEDS="0 1"] \
    python bench/results/2026-12-06-cpu-demo-seeing-start/collect.py
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

W = Path(os.environ.get("W", "/tmp/seeing"))  # run.sh's W and SEEDS
SEEDS = [int(x) for x in os.environ.get("SEEDS", "0 1").split()]
START = os.environ.get("START", "sft0")  # run.sh's start: sft0, or sftL with LONG=1
HERE = Path(__file__).resolve().parent / os.environ.get("SUBDIR", "")
HERE.mkdir(exist_ok=True)


def mean(xs):
    return round(sum(xs) / len(xs), 3)


for s in SEEDS:
    for name in (START, "A", "B"):
        (summary,) = (W / f"eval-{name}_{s}").glob("*/summary.json")
        shutil.copy(summary, HERE / f"seed{s}-eval-{name}-summary.json")
    shutil.copy(W / f"paired_{s}.json", HERE / f"seed{s}-paired.json")
    for name in ("sft0", *([START] if START != "sft0" else []), "A"):
        shutil.copy(W / f"{name}_{s}" / "sft_history.json", HERE / f"seed{s}-{name}-sft_history.json")
    shutil.copy(W / f"seeing_{s}" / "vision_pretrain_history.json", HERE / f"seed{s}-seeing-history.json")
    walls = {
        stage: (W / "logs" / f"{stage}_{s}.wall").read_text().strip()
        for stage in ("seeing", "sft0", *([START] if START != "sft0" else []), "B", "A")
    }
    (HERE / f"seed{s}-wall-s.json").write_text(json.dumps(walls, indent=1))
    rows = [json.loads(line) for line in open(W / "runs" / f"B_{s}" / "metrics.jsonl")]
    steps = [r for r in rows if "rollout/success_all" in r]
    curve = {
        "per_step": [
            {
                "step": r["step"],
                "success_all": round(r["rollout/success_all"], 4),
                "entropy": round(r["train/entropy"], 4),
                "wall_bumps": round(r["episode/wall_bumps"], 4),
            }
            for r in steps
        ],
        "per_10_steps": [
            {
                "steps": f"{i + 1}-{i + 10}",
                "success_all": mean([r["rollout/success_all"] for r in steps[i : i + 10]]),
                "entropy": mean([r["train/entropy"] for r in steps[i : i + 10]]),
                "wall_bumps": mean([r["episode/wall_bumps"] for r in steps[i : i + 10]]),
            }
            for i in range(0, len(steps), 10)
        ],
        "in_run_eval": [
            {"step": r["step"], "n": r["eval/n"], "success_rate": r["eval/success_rate"]}
            for r in rows
            if "eval/success_rate" in r
        ],
    }
    (HERE / f"seed{s}-armB-curve.json").write_text(json.dumps(curve, indent=1))
shutil.copy(W / "logs" / "stages.txt", HERE / "stages.txt")
