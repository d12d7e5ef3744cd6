#!/usr/bin/env python
"""Scaling of the reference GRPO workload over 1..W GPUs through the Ray runtime.

Each run is `GRPOTrainer` on `runtime.backend=ray` with W worker actors (one GPU each; W > 1
shards the policy with FSDP2 and gives every worker its own rollout engine), the workload of
`bench/grpo_bench.py` (maze_plan 5x5, 8 samples per prompt, 128 new tokens, LoRA r=32, one
optimizer step per batch), warm-up steps first. A run is `W:PROMPTS`:

  - weak scaling: PROMPTS = 8 x W (64 completions per GPU), efficiency = throughput(W) / (W x throughput(1));
  - strong scaling: PROMPTS = 8 at every W (the same 64 completions), efficiency = t(1) / (W x t(W)).

The model directory is built first when missing (the preset, in memory on the first GPU, saved
in bf16), because workers load their model from disk.

    python bench/ray_scaling.py --model-dir /tmp/qwen3vl-8b-shape --runs 1:8,2:16,2:8 --out scaling.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

import grpo_bench  # noqa: E402  (the workload definition)


def ensure_model_dir(path: Path, settings: grpo_bench.BenchSettings) -> float:
    """Build and save the preset at `path` unless it is there; returns the seconds it took."""
    return grpo_bench.save_preset(path, settings)


def run_one(
    settings: grpo_bench.BenchSettings, model_dir: Path, workers: int, prompts: int, use_gpu: bool, storage: Path
) -> dict:
    """Warm-up + measured steps of one worker-group size; the trainer's own step metrics."""
    from vlrl.training.trainer import GRPOTrainer

    run = grpo_bench.BenchSettings(**{**settings.__dict__, "prompts": prompts})
    config = grpo_bench.bench_config(run, model_dir, storage)
    total = settings.warmup + settings.steps
    for key, value in {
        "model.path": str(model_dir),
        "runtime.backend": "ray",
        "runtime.num_workers": workers,
        "runtime.use_gpu": use_gpu,
        "runtime.cpus_per_worker": 4 if use_gpu else 1,
        "runtime.object_store_memory_mb": 1024,
        "train.steps": total,
        "train.eval_every": 0,
        "train.checkpoint_every": 0,
        "storage.root": str(storage),
    }.items():
        section, field = key.split(".")
        setattr(getattr(config, section), field, value)
    t0 = time.perf_counter()
    trainer = GRPOTrainer(config, storage / f"w{workers}-p{prompts}")
    try:
        trainer.setup()
        start_s = time.perf_counter() - t0
        rows = []
        for i in range(total):
            values = trainer.step().values
            rows.append({k: v for k, v in values.items() if k.startswith(("time/", "throughput/"))})
            print(
                f"[ray W={workers} prompts={prompts}] step {i}: {values['time/step_s']:.2f} s "
                f"(rollout {values['time/rollout_s']:.2f}, update {values.get('time/update_s', 0):.2f}, "
                f"sync {values['time/sync_s']:.3f})",
                flush=True,
            )
    finally:
        trainer.close()
    measured = rows[settings.warmup :] or rows
    mean = {k: sum(r[k] for r in measured if k in r) / len(measured) for k in measured[0]}
    completions = prompts * settings.samples
    return {
        "workers": workers,
        "prompts": prompts,
        "completions": completions,
        "start_s": start_s,
        "steps": rows,
        "mean": mean,
        "completions_per_s": completions / mean["time/step_s"],
    }


def scaling_table(runs: list[dict]) -> list[dict]:
    """Efficiency of each run against the one-worker run with the same per-GPU or total batch."""
    base = {r["prompts"]: r for r in runs if r["workers"] == 1}
    out = []
    for r in runs:
        w = r["workers"]
        weak = base.get(r["prompts"] // w) if r["prompts"] % w == 0 else None
        strong = base.get(r["prompts"])
        row = {
            "workers": w,
            "prompts": r["prompts"],
            "step_s": r["mean"]["time/step_s"],
            "completions_per_s": r["completions_per_s"],
        }
        if weak is not None and w > 1:
            row["weak_efficiency"] = r["completions_per_s"] / (w * weak["completions_per_s"])
        if strong is not None and w > 1:
            row["strong_efficiency"] = strong["mean"]["time/step_s"] / (w * r["mean"]["time/step_s"])
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3vl-8b-shape", help="preset to build when --model-dir is missing")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--runs", default="1:8,2:16", help="WORKERS:PROMPTS, comma-separated")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--cpu", action="store_true", help="workers on CPU slots (tests)")
    p.add_argument("--maze-size", type=int, default=5)
    p.add_argument("--cell-px", type=int, default=45)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    settings = grpo_bench.BenchSettings(
        model=a.model,
        device="cpu" if a.cpu else "auto",
        dtype=a.dtype,
        samples=a.samples,
        new_tokens=a.new_tokens,
        micro_batch=a.micro_batch,
        warmup=a.warmup,
        steps=a.steps,
        maze_size=a.maze_size,
        cell_px=a.cell_px,
    )
    model_dir = Path(a.model_dir)
    result = {"environment": grpo_bench.environment_info(settings.resolved_device()), "settings": vars(a)}
    result["build_s"] = ensure_model_dir(model_dir, settings)
    print(f"model directory {model_dir} ready ({result['build_s']:.0f} s to build)", flush=True)
    runs: list[dict] = []
    result["runs"], result["scaling"] = runs, []
    with tempfile.TemporaryDirectory() as storage:
        for spec in [r for r in a.runs.split(",") if r.strip()]:  # --runs "": only build the model
            workers, prompts = (int(x) for x in spec.split(":"))
            try:
                runs.append(run_one(settings, model_dir, workers, prompts, not a.cpu, Path(storage)))
            except Exception as exc:  # keep the other runs' figures
                print(f"[ray W={workers} prompts={prompts}] failed: {type(exc).__name__}: {exc}", flush=True)
                result.setdefault("errors", []).append({"run": spec, "error": f"{type(exc).__name__}: {exc}"})
            result["runs"], result["scaling"] = runs, scaling_table(runs)
            if a.out:  # after every run: a later failure keeps what was measured
                Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'workers':>8}{'prompts':>9}{'s/step':>9}{'compl/s':>9}{'weak eff':>10}{'strong eff':>11}")
    for row in result["scaling"]:
        weak = f"{row['weak_efficiency']:.0%}" if "weak_efficiency" in row else "-"
        strong = f"{row['strong_efficiency']:.0%}" if "strong_efficiency" in row else "-"
        print(
            f"{row['workers']:>8}{row['prompts']:>9}{row['step_s']:>9.2f}{row['completions_per_s']:>9.2f}{weak:>10}{strong:>11}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
