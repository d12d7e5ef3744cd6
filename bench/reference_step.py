#!/usr/bin/env python
"""The seed's own workload on one GPU: one worker's share of configs/qwen3vl-8b-6gpu.yaml through vlrl's trainer.

The config's workload (8B shape, 9x9 block maze, 18 turns, group 8, KL 0.005, 4 optimizer steps
per batch, gradient checkpointing) with the share one of its `runtime.num_workers` GPUs takes:
ceil(tasks_per_step / workers) tasks of `group_size` episodes, a mini-batch that keeps the
config's optimizer steps per batch, micro-batches of at most `micro_batch_size` that divide it
(the 6-GPU config: 6 tasks x 8 = 48 episodes, 4 optimizer steps of 12, micro-batch 6). It runs with one local
worker (`runtime.backend=local`) and the engine asked for (`rollout.engine=vllm | transformers`),
and writes s/step, the phase split (the trainer's `time/*` keys of metrics.jsonl) and peak
memory (torch's allocator peaks, the device's used memory polled, host RSS) as JSON.

By default the steps are `GRPOTrainer.step` (what `vlrl train` runs between setup and the final
evaluation); `--via-cli` runs the whole `vlrl train` command in-process instead (then the final
evaluation, checkpoint and adapter save come on top, outside the per-step figures).

    python bench/reference_step.py --model-dir /tmp/m8b --init-tiny qwen3vl-8b-shape --engine vllm \\
        --steps 2 --warmup 1 --out ref_vllm.json
    python bench/reference_step.py --merge ref_vllm.json ref_hf.json          # side by side
    # CPU smoke (tiny model, short episodes):
    python bench/reference_step.py --model-dir /tmp/ref-ci --init-tiny ci --device cpu --engine transformers \\
        --steps 2 --warmup 1 model.dtype=float32 env.cell_px=16 env.max_turns=2 rollout.max_new_tokens=4 \\
        rollout.max_model_len=4096 algo.group_size=2
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))

DEFAULT_CONFIG = ROOT / "configs" / "qwen3vl-8b-6gpu.yaml"


def share_overrides(config, workers: int | None = None) -> tuple[list[str], dict[str, int]]:
    """Overrides that give one worker its share of a `workers`-GPU step (default: the config's
    runtime.num_workers): ceil(tasks / workers) tasks, and the mini-batch that keeps the number of
    optimizer steps per batch the config has."""
    a = config.algo
    workers = workers or config.runtime.num_workers
    tasks = max(1, math.ceil(a.tasks_per_step / workers))
    episodes = tasks * a.group_size
    optimizer_steps = max(1, math.ceil(a.tasks_per_step * a.group_size / a.mini_batch_size))
    mini = max(1, math.ceil(episodes / optimizer_steps))
    # A mini-batch is whole micro-batches: the largest divisor of it up to the configured size.
    micro = max(d for d in range(1, min(a.micro_batch_size, mini) + 1) if mini % d == 0)
    share = {
        "workers": workers,
        "tasks_per_step": tasks,
        "episodes_per_step": episodes,
        "optimizer_steps_per_batch": math.ceil(episodes / mini),
        "mini_batch_size": mini,
        "micro_batch_size": micro,
    }
    return [
        f"algo.tasks_per_step={tasks}",
        f"algo.mini_batch_size={mini}",
        f"algo.micro_batch_size={share['micro_batch_size']}",
    ], share


def _harness():
    """bench/grpo_bench.py (its preset saving and device polling)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    import grpo_bench

    return grpo_bench


def memory_figures(poll) -> dict[str, float]:
    """Peaks over the run: torch's allocator, the device as polled (vLLM's pool included), host RSS."""
    import torch

    out = {"host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, **poll.figures()}
    if torch.cuda.is_available():
        out.update(
            torch_peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
            torch_peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
            device_total_gib=torch.cuda.mem_get_info()[1] / 2**30,
        )
    return out


def summarize(records: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Mean per-step figures over the records after `warmup`: s/step, every time/* phase and its
    share of the step, throughputs."""
    measured = records[warmup:] or records
    keys = sorted({k for r in measured for k in r if k.startswith(("time/", "throughput/"))})
    means = {k: sum(r.get(k, 0.0) for r in measured) / len(measured) for k in keys}
    step_s = means.get("time/step_s", 0.0)
    phases = {k[5:]: v for k, v in means.items() if k.startswith("time/") and k != "time/step_s"}
    return {
        "measured_steps": [r["step"] for r in measured],
        "step_s": step_s,
        "phases_s": phases,
        "phase_share": {k: v / step_s for k, v in phases.items()} if step_s else {},
        "throughput": {k[11:]: v for k, v in means.items() if k.startswith("throughput/")},
        "episodes_per_step": sum(
            r.get("throughput/episodes_per_s", 0.0) * r.get("time/rollout_s", 0.0) for r in measured
        )
        / len(measured),
    }


def build_overrides(args: argparse.Namespace, run_root: Path) -> tuple[list[str], dict[str, int]]:
    from vlrl.config import load_config

    base = load_config(args.config, args.overrides)
    share, share_info = share_overrides(base, args.workers)
    use_gpu = args.device == "cuda" or (args.device == "auto" and _cuda())
    fixed = [
        f"model.path={args.model_dir}",
        f"rollout.engine={args.engine}",
        "runtime.backend=local",
        "runtime.num_workers=1",
        f"runtime.use_gpu={str(use_gpu).lower()}",
        f"train.steps={args.steps}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "train.eval_tasks=1",
        "tracking.enabled=false",
        "tracking.exporter_port=null",  # no Prometheus port opened by a benchmark
        f"storage.root={run_root}",
        f"storage.run_name=reference-{args.engine}",
    ]
    if args.gpu_memory_utilization:
        fixed.append(f"rollout.gpu_memory_utilization={args.gpu_memory_utilization}")
    return [*args.overrides, *share, *fixed], share_info


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def ensure_model_dir(args: argparse.Namespace, dtype: str) -> float:
    """Build the preset `--init-tiny` at --model-dir when it is not there (on the GPU when there
    is one: the 8B shape initialises in seconds there, minutes on the CPU); the seconds taken."""
    if (Path(args.model_dir) / "config.json").is_file():
        return 0.0
    if not args.init_tiny:
        raise SystemExit(f"--model-dir {args.model_dir} holds no model; pass --init-tiny PRESET to build one")
    gb = _harness()
    device = args.device if args.device != "auto" else ("cuda" if _cuda() else "cpu")
    return gb.save_preset(Path(args.model_dir), gb.BenchSettings(model=args.init_tiny, device=device, dtype=dtype))


def run(args: argparse.Namespace) -> dict[str, Any]:
    import os

    # The presets declare 4096 positions (RoPE goes further); the config's rollout.max_model_len is
    # 16384 (18 turns of up to 256 tokens), which vLLM refuses for such a model unless allowed.
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    import torch

    from vlrl.config import load_config

    run_root = Path(args.run_root or tempfile.mkdtemp(prefix="vlrl-reference-"))
    overrides, share = build_overrides(args, run_root)
    config = load_config(args.config, overrides)
    build_s = ensure_model_dir(args, config.model.dtype)
    run_dir = run_root / config.storage.run_name
    result: dict[str, Any] = {
        "workload": {
            "config": str(args.config),
            "overrides": overrides,
            "engine": args.engine,
            "share_of": share,
            "model_dir": str(args.model_dir),
            "dtype": config.model.dtype,
            "maze": f"{config.env.layout} {config.env.sizes}, cell_px {config.env.cell_px}, "
            f"max_turns {config.env.max_turns}",
            "group_size": config.algo.group_size,
            "kl_coef": config.algo.kl_coef,
            "max_new_tokens": config.rollout.max_new_tokens,
            "gradient_checkpointing": config.train.gradient_checkpointing,
            "mode": "vlrl train (in-process)" if args.via_cli else "GRPOTrainer.step",
        },
        "environment": {
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "host": platform.node(),
            **({"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}),
        },
        "model_build_s": build_s,
        "run_dir": str(run_dir),
    }
    t0 = time.perf_counter()
    stopped = None
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()  # the run's peaks, not the preset's build
    device = torch.device("cuda" if config.runtime.use_gpu else "cpu")
    with _harness().DevicePeak(device) as peak:
        try:
            if args.via_cli:
                from vlrl.cli import app

                app(["train", str(args.config), *overrides, "--quiet"], prog_name="vlrl", standalone_mode=False)
            else:
                run_steps(config, run_dir, args, t0, result, peak)
        except Exception as exc:  # a run that stops part-way still reports the steps it made
            stopped = f"{type(exc).__name__}: {exc}"
    result["wall_s"] = time.perf_counter() - t0
    if stopped:
        result["stopped"] = stopped
    result.update(collect(run_dir, args.warmup), memory=memory_figures(peak))
    return result


def run_steps(config, run_dir: Path, args, t0: float, result: dict[str, Any], peak) -> None:
    """setup, then `GRPOTrainer.step` up to --steps times (fewer when --time-budget-s would be passed)."""
    from vlrl.training.trainer import GRPOTrainer

    trainer = GRPOTrainer(config, run_dir)
    try:
        trainer.setup()
        result["setup_s"] = time.perf_counter() - t0
        last = 0.0
        for i in range(args.steps):
            if args.time_budget_s and time.perf_counter() - t0 + last > args.time_budget_s:
                result["stopped"] = f"time budget {args.time_budget_s} s: {i} of {args.steps} steps"
                break
            s0 = time.perf_counter()
            m = trainer.step()
            last = time.perf_counter() - s0
            print(f"[reference] step {m.step}: {m.values.get('time/step_s', last):.1f} s", flush=True)
            if args.out:  # written after every step: a run killed by its time limit keeps what it measured
                write(args.out, {**result, **collect(run_dir, args.warmup), "memory": memory_figures(peak)})
    finally:
        trainer.close()


def collect(run_dir: Path, warmup: int) -> dict[str, Any]:
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    steps = [{k: v for k, v in r.items() if k == "step" or k.startswith(("time/", "throughput/"))} for r in records]
    return {"steps": steps, "summary": summarize(records, warmup) if records else {}}


def write(path: str, result: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")


def format_table(results: list[dict[str, Any]]) -> str:
    """The runs side by side: s/step, phases (s and share of the step), throughputs, memory."""
    if not results:
        return ""
    names = [r["workload"]["engine"] for r in results]
    w = max(14, *(len(n) + 2 for n in names))
    first = results[0]["workload"]
    share = first["share_of"]
    lines = [
        f"reference workload, one GPU's share of {Path(first['config']).name} ({share['workers']} workers): "
        f"{share['tasks_per_step']} tasks x {first['group_size']} = {share['episodes_per_step']} episodes, "
        f"{share['optimizer_steps_per_batch']} optimizer steps (mini-batch {share['mini_batch_size']}, micro "
        f"{share['micro_batch_size']}), {first['maze']}, KL {first['kl_coef']}, {first['max_new_tokens']} new tokens "
        f"a turn; {first['mode']}",
        f"{results[0]['environment'].get('gpu', 'cpu')} | torch {results[0]['environment']['torch']}",
        "",
        f"{'metric':<34}" + "".join(f"{n:>{w}}" for n in names),
    ]

    def row(label: str, values: list[Any], fmt: str) -> None:
        lines.append(f"{label:<34}" + "".join(f"{fmt.format(v) if v is not None else '-':>{w}}" for v in values))

    sums = [r.get("summary", {}) for r in results]
    row("s / step", [s.get("step_s") for s in sums], "{:.2f}")
    seen = {k for s in sums for k in s.get("phases_s", {})}
    nested = {"generate_s": "rollout_s", "env_s": "rollout_s", "logprob_s": "update_s", "optim_s": "update_s"}
    order = ["rollout_s", "generate_s", "env_s", "update_s", "logprob_s", "optim_s", "sync_s"]
    for k in [k for k in order if k in seen] + sorted(seen - set(order)):
        row(
            f"  {'  ' if k in nested else ''}{k}",
            [
                f"{s['phases_s'][k]:.2f} ({s['phase_share'].get(k, 0):.0%})" if k in s.get("phases_s", {}) else None
                for s in sums
            ],
            "{}",
        )
    for k in sorted({k for s in sums for k in s.get("throughput", {})}):
        row(k, [s.get("throughput", {}).get(k) for s in sums], "{:,.1f}")
    for k in sorted({k for r in results for k in r.get("memory", {})}):
        row(k, [r.get("memory", {}).get(k) for r in results], "{:.1f}")
    row("setup s (policy + engine)", [r.get("setup_s") for r in results], "{:.0f}")
    for r in results:
        if r.get("stopped"):
            lines.append(f"{r['workload']['engine']}: stopped: {r['stopped']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("overrides", nargs="*", help="dotted config overrides, applied before the share is taken")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--model-dir", default=None, help="the model directory (model.path)")
    p.add_argument("--init-tiny", default=None, help="build this preset at --model-dir when it is not there")
    p.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--workers", type=int, default=None, help="GPUs the config's step is shared by (its num_workers)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="first steps left out of the means")
    p.add_argument("--gpu-memory-utilization", default=None, help="rollout.gpu_memory_utilization (vLLM)")
    p.add_argument("--time-budget-s", type=float, default=None, help="start no step that would end past this")
    p.add_argument("--via-cli", action="store_true", help="run the whole `vlrl train` command in-process")
    p.add_argument("--run-root", default=None, help="storage.root of the run (default: a temporary directory)")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    p.add_argument("--merge", nargs="+", metavar="JSON", default=None, help="print results side by side")
    args = p.parse_args(argv)
    if not args.merge and not args.model_dir:
        p.error("--model-dir is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        results = [json.loads(Path(f).read_text()) for f in args.merge]
        print(format_table(results))
        if args.out:
            write(args.out, {"runs": results})
        return 0
    result = run(args)
    print(format_table([result]))
    if args.out:
        write(args.out, result)
    return 1 if result.get("stopped") and not result.get("steps") else 0


if __name__ == "__main__":
    sys.exit(main())
