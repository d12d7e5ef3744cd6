#!/usr/bin/env python
"""Peak memory and throughput of the GRPO update (`Policy`), without rollouts and without Ray.

The model is built in memory by our own code (default: the `qwen3vl-8b-shape` preset, random
weights, bf16, LoRA r=32 on the language model); the sequences are synthetic but shaped exactly
like the trainer's (real chat template, real maze images, random response tokens). Two workloads:

  single  the `vlrl bench` step (issue 10): 64 sequences of the 5x5 `maze_plan` prompt (225 px,
          49 image tokens) + 128 response tokens, one optimizer step, no KL.
  multi   one worker's share of configs/qwen3vl-8b-6gpu.yaml: 256 episodes a step over 6 workers,
          the 9x9 blocks maze (225 px), 18 turns of `--turn-tokens` response tokens each (with
          an image after every turn), group 8, mini-batch 64 (4 optimizer steps), KL 0.005.
          Rank 0's `UpdatePlan` of the 6-worker update is run as it is (old and reference
          scoring of its ~43 episodes, then its micro-batches of each mini-batch); the
          gradient all-reduce is the only part left out.

Each (workload, loss implementation, micro-batch size) runs `--warmup` + `--iters` updates; the
peak allocated memory (torch.cuda.max_memory_allocated, from a reset after the model and the
optimizer were built) and update tokens/s (all tokens of the updated sequences / update seconds,
as the trainer's throughput/train_tokens_per_s) are reported. Loss passes (`--single-impl`,
`--multi-impl`): `legacy` is the former one (logits at every position, `algo.logit_chunk_size=0`),
`chunked` the current one, `chunked-ckpt` the current one with `train.gradient_checkpointing`, so
before and after come from the same run on the same GPU. A configuration that runs out of memory
is reported as such and the run goes on.

    python bench/update_memory.py --out update_memory.json                        # H200, ~4 min
    python bench/update_memory.py --model ci --device cpu --dtype float32 --out m.json   # smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT / "src", ROOT / "bench"):
    if str(path) not in sys.path:  # run from a checkout without installing
        sys.path.insert(0, str(path))

import grpo_bench  # noqa: E402  (the model builder and the workload's config)

WORKERS = 6  # configs/qwen3vl-8b-6gpu.yaml
IMPLS = ("legacy", "chunked", "chunked-ckpt")


def _workload_config(settings: grpo_bench.BenchSettings, workload: str, micro: int, impl: str, turn_tokens: int):
    """The RunConfig of one measured configuration."""
    from vlrl.config import load_config

    if workload == "single":
        config = grpo_bench.bench_config(settings, Path(settings.model), Path(tempfile.gettempdir()))
    else:
        config = load_config(
            ROOT / "configs" / "qwen3vl-8b-6gpu.yaml",
            [
                f"model.path={settings.model}",
                f"model.dtype={settings.dtype}",
                "runtime.backend=local",
                "runtime.num_workers=1",
                "runtime.use_gpu=false",
                "tracking.enabled=false",
                "storage.root=/tmp",
                f"rollout.max_new_tokens={turn_tokens}",
            ],
        )
    config.algo.micro_batch_size = micro
    config.algo.logit_chunk_size = 0 if impl == "legacy" else 1024
    return config


def _sequences(config, processor, workload: str, count: int, turns: int, turn_tokens: int, seed: int):
    """`count` synthetic episodes: the env's real first prompt, then `turns` x (random response
    tokens, the next observation with its image). Response tokens avoid the vision special tokens."""
    from vlrl.envs.base import build_split, make_env
    from vlrl.models.loading import vision_special_token_ids
    from vlrl.rollout.sequence import ChatFormat

    chat = ChatFormat(processor)
    env = make_env(config.env)
    task = build_split(config.env, "train")[0]
    obs = env.reset(task)
    prompt = chat.prompt(env.system_prompt, obs)
    g = torch.Generator().manual_seed(seed)
    banned = set(vision_special_token_ids(processor))
    vocab = len(processor.tokenizer)
    allowed = torch.tensor([t for t in range(min(vocab, 4096)) if t not in banned])
    piece = chat.observation_piece(obs, response_ended=False) if turns > 1 else None
    out = []
    for _ in range(count):
        seq = prompt.copy()
        for turn in range(turns):
            ids = allowed[torch.randint(len(allowed), (turn_tokens,), generator=g)].tolist()
            seq.append_sampled(ids, (-2.0 + 0.1 * torch.randn(turn_tokens, generator=g)).tolist())
            if piece is not None and turn < turns - 1:
                seq.extend(piece.copy())
        out.append(seq)
    return out


class _Episode:
    """What `Policy.run_plan` reads of an episode: its sequence."""

    def __init__(self, sequence):
        self.sequence = sequence


def _measure(model, processor, settings, workload: str, impl: str, micro: int, args) -> dict[str, Any]:
    from vlrl.models.loading import vision_special_token_ids
    from vlrl.runtime.update_plan import combine_update_stats, loss_units, make_update_plans
    from vlrl.training.policy import Policy

    device = settings.resolved_device()
    turns = 1 if workload == "single" else args.turns
    turn_tokens = settings.new_tokens if workload == "single" else args.turn_tokens
    config = _workload_config(settings, workload, micro, impl, turn_tokens)
    a = config.algo
    total = a.tasks_per_step * a.group_size
    world = 1 if workload == "single" else args.workers
    seqs = _sequences(config, processor, workload, total, turns, turn_tokens, settings.seed)
    advantages = torch.randn(total, generator=torch.Generator().manual_seed(1)).tolist()
    plan = make_update_plans([loss_units(s) for s in seqs], 0, a, world)[0]
    held = [_Episode(seqs[i]) for i in plan.indices]
    held_adv = [advantages[i] for i in plan.indices]
    steps = settings.warmup + settings.steps
    base = model.get_base_model()
    if impl == "chunked-ckpt":
        from vlrl.models.loading import enable_activation_checkpointing

        enable_activation_checkpointing(model)
    elif base.is_gradient_checkpointing:
        base.gradient_checkpointing_disable()
    policy = Policy(
        model,
        config,
        vision_special_token_ids(processor),
        processor.tokenizer.pad_token_id,
        total_optimizer_steps=steps * len(plan.steps),
        world_size=world,
    )
    row: dict[str, Any] = {
        "workload": workload,
        "loss_impl": impl,
        "micro_batch": micro,
        "episodes": len(held),
        "tokens_per_episode": len(seqs[0]),
        "loss_tokens_per_episode": loss_units(seqs[0]),
        "optimizer_steps": len(plan.steps),
        "kl_coef": a.kl_coef,
    }
    tokens = sum(len(e.sequence) for e in held)
    times = []
    _release(device)
    try:
        for it in range(steps):
            grpo_bench._sync(device)
            t0 = time.perf_counter()
            stats = combine_update_stats([policy.run_plan(held, held_adv, plan)])
            grpo_bench._sync(device)
            if it >= settings.warmup:
                times.append(time.perf_counter() - t0)
        row.update(
            {
                "update_s": sum(times) / len(times),
                "update_tokens_per_s": tokens / (sum(times) / len(times)),
                "loss": stats.get("loss"),
                "oom": False,
            }
        )
    except torch.OutOfMemoryError as exc:
        row.update({"oom": True, "error": str(exc).splitlines()[0]})
    row.update(grpo_bench._memory(device))
    # The next configuration starts from fresh LoRA weights, optimizer state and peak counters.
    policy.optimizer.zero_grad(set_to_none=True)
    del policy
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.zero_()
    _release(device)
    return row


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3vl-8b-shape", help="tiny preset (built in memory) or a model directory")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--workload", choices=["single", "multi", "both"], default="both")
    p.add_argument(
        "--single-impl",
        default="legacy,chunked",
        help="loss passes of the single-turn workload: legacy | chunked | chunked-ckpt",
    )
    p.add_argument("--multi-impl", default="legacy,chunked,chunked-ckpt", help="loss passes of the multi-turn workload")
    p.add_argument("--single-micro", default="16,32", help="micro-batch sizes of the single-turn workload")
    p.add_argument(
        "--multi-micro", default="4,8", help="micro-batch sizes of the multi-turn workload (the config's is 8)"
    )
    p.add_argument("--turns", type=int, default=18)
    p.add_argument("--turn-tokens", type=int, default=64, help="response tokens per turn of the multi-turn workload")
    p.add_argument("--workers", type=int, default=WORKERS, help="workers the multi-turn step is shared by")
    p.add_argument("--prompts", type=int, default=8, help="single-turn: prompts (x samples = sequences)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument(
        "--multi-iters", type=int, default=1, help="measured updates of the multi-turn workload (no warm-up)"
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    from vlrl.models.lora import apply_lora

    settings = grpo_bench.BenchSettings(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        prompts=args.prompts,
        samples=args.samples,
        new_tokens=args.new_tokens,
        warmup=args.warmup,
        steps=args.iters,
    )
    device = settings.resolved_device()
    t0 = time.perf_counter()
    base, processor = grpo_bench.build_model(settings, device)
    config = grpo_bench.bench_config(settings, Path(settings.model), Path(tempfile.gettempdir()))
    model = apply_lora(
        base, settings.lora_rank, settings.lora_alpha, 0.0, config.model.lora.target_modules, seed=settings.seed
    )
    model.to(device)
    build_s = time.perf_counter() - t0
    _release(device)
    weights_gib = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None

    def listed(text: str) -> list[str]:
        return [s.strip() for s in text.split(",") if s.strip()]

    for impl in listed(args.single_impl) + listed(args.multi_impl):
        if impl not in IMPLS:
            raise SystemExit(f"unknown loss pass {impl!r}; choose from {', '.join(IMPLS)}")
    rows = []
    plans = []
    if args.workload in ("single", "both"):
        plans += [("single", impl, int(m)) for m in listed(args.single_micro) for impl in listed(args.single_impl)]
    if args.workload in ("multi", "both"):
        plans += [("multi", impl, int(m)) for m in listed(args.multi_micro) for impl in listed(args.multi_impl)]
    for workload, impl, micro in plans:
        run = (
            settings
            if workload == "single"
            else grpo_bench.BenchSettings(**{**settings.__dict__, "warmup": 0, "steps": args.multi_iters})
        )
        row = _measure(model, processor, run, workload, impl, micro, args)
        rows.append(row)
        peak = row.get("peak_allocated_gib")
        print(
            f"[update-memory] {workload:6s} {impl:7s} micro {micro:3d}: "
            + ("OOM" if row["oom"] else f"{row['update_tokens_per_s']:.0f} tok/s")
            + (f", peak {peak:.1f} GiB" if peak is not None else ""),
            flush=True,
        )
    result = {
        "model": args.model,
        "device": str(device),
        "dtype": args.dtype,
        "build_s": build_s,
        "weights_gib": weights_gib,
        "gpu": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "turns": args.turns,
        "turn_tokens": args.turn_tokens,
        "workers": args.workers,
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
