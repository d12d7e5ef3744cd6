#!/usr/bin/env python
"""The vLLM engine on a GPU, beside the policy on the same device, in bf16: does it sample the policy?

Checks (each one asserted, its figures written to --out as JSON):

1. parity on image prompts: vLLM's greedy tokens re-scored by the policy (teacher forcing, bf16):
   |log-prob gap| mean and max, and how many answers the policy's own greedy decoding reproduces;
2. parity over whole multi-turn maze episodes (greedy, several images per conversation);
3. an adapter with LoRA on the vision tower too: parity holds, and zeroing the vision half moves
   vLLM's log-probs by more than the parity gap (vLLM alone would ignore it: vllm-project/vllm#32541);
4. after a real optimizer step on vLLM-sampled episodes the engine serves the new adapter;
5. no stale adapter after syncing versions 10, 11, 10, 12 (fresh ids);
6. sleep (level 1) frees GPU memory and wake restores it, and generation after waking still matches.

bf16 tolerances are what this script asserts (`--max-gap`, `--min-identical`); the figures
observed on an H200 are in bench/RESULTS.md. Runs on one GPU with vLLM installed, alone or as
`bash bench/gpu_vllm.sh checks`.

    python bench/gpu_vllm_checks.py --model-dir /tmp/tiny-ci --out /tmp/checks.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

GIB = 2**30


def gap_stats(worker, prompts, completions) -> dict[str, float]:
    """vLLM's greedy completions against the policy: teacher-forced |log-prob gap| (the policy
    re-scores vLLM's tokens) and how many answers the policy's own greedy decoding reproduces."""
    seqs, comps = [], []
    for prompt, per in zip(prompts, completions):
        for comp in per:
            seq = prompt.copy()
            seq.append_sampled(comp.token_ids, comp.logprobs)
            seqs.append(seq)
            comps.append(comp)
    with torch.no_grad():
        scored = worker.policy.score_no_grad(seqs)
    gap = torch.cat(
        [(lp[-len(c.token_ids) :].float() - torch.tensor(c.logprobs)).abs() for lp, c in zip(scored, comps)]
    )
    from vlrl.rollout.engine import SamplingParams

    hf = worker.engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=len(comps[0].token_ids)))
    same = sum(h[0].token_ids == v[0].token_ids for h, v in zip(hf, completions))
    return {
        "gap_mean": float(gap.mean()),
        "gap_max": float(gap.max()),
        "tokens": int(gap.numel()),
        "identical_greedy_answers": same,
        "answers": len(prompts),
    }


def set_lora_b(worker, seed: int, scale: float, vision_only: bool = False, value: float | None = None) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in worker.model.named_parameters():
            if "lora_B" in name and (not vision_only or ".visual." in name):
                if value is not None:
                    param.fill_(value)
                else:
                    param.copy_((torch.randn(param.shape, generator=gen) * scale).to(param.dtype))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-gap", type=float, default=0.25, help="asserted bound on max |log-prob gap| (bf16)")
    p.add_argument(
        "--min-identical",
        type=float,
        default=0.6,
        help="asserted share of identical greedy answers (bf16; 12 of 16 seen on an H200)",
    )
    p.add_argument("--memory-share", type=float, default=0.2)
    args = p.parse_args()

    from vlrl.config import load_config
    from vlrl.envs.base import build_split, make_env
    from vlrl.rollout.engine import SamplingParams
    from vlrl.rollout.episodes import run_episodes
    from vlrl.rollout.factory import build_engine
    from vlrl.training.worker import Worker

    if not Path(args.model_dir, "config.json").is_file():
        from vlrl.models.tiny import build_tiny_model

        build_tiny_model(args.model_dir, size="ci", seed=0)
    results: dict = {
        "model_dir": args.model_dir,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "checks": {},
    }
    failures: list[str] = []

    def check(name: str, ok: bool, **figures) -> None:
        results["checks"][name] = {"ok": bool(ok), **figures}
        print(f"[{'ok' if ok else 'FAIL'}] {name}: {figures}", flush=True)
        if not ok:
            failures.append(name)

    gpu = torch.cuda.is_available()  # without one: a CPU smoke run of the script itself (fp32, no sleep)
    dtype = "bfloat16" if gpu else "float32"
    cfg = load_config(
        ROOT / "configs" / "ci-tiny.yaml",
        [
            f"model.path={args.model_dir}",
            "runtime.backend=local",
            f"runtime.use_gpu={str(gpu).lower()}",
            f"model.dtype={dtype}",
            "rollout.engine=transformers",
            "model.lora.include_vision=true",
            "rollout.max_model_len=2048",
        ],
    )
    worker = Worker(cfg, total_optimizer_steps=4)
    t0 = time.perf_counter()
    free = (lambda: torch.cuda.mem_get_info()[0]) if gpu else (lambda: 0)
    free0 = free()
    engine = build_engine(
        cfg,
        worker.chat,
        worker.model,
        engine="vllm",
        model_dir=args.model_dir,
        gpu_memory_utilization=args.memory_share,
        kv_cache_memory_mb=64,
        max_num_seqs=64,
        seed=0,
    )
    results["engine"] = {
        "startup_s": time.perf_counter() - t0,
        "transport": engine.adapter_transport,
        "vllm_gib": (free0 - free()) / GIB,
    }
    import vllm

    results["vllm_version"] = vllm.__version__
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    split = build_split(cfg.env, "train")
    prompts = []
    for i in range(args.prompts):
        env = make_env(cfg.env)
        prompts.append(worker.chat.prompt(env.system_prompt, env.reset(split[i])))

    # 1 + 3: image prompts, with a vision-tower adapter
    set_lora_b(worker, seed=1, scale=0.3)
    engine.update_adapter(worker.adapter_state(), 1)
    with_vision = engine.generate(prompts, greedy)
    stats = gap_stats(worker, prompts, with_vision)
    check(
        "image_prompts_parity",
        stats["gap_max"] < args.max_gap and stats["identical_greedy_answers"] >= args.min_identical * stats["answers"],
        **stats,
    )
    set_lora_b(worker, seed=0, scale=0.0, vision_only=True, value=0.0)
    engine.update_adapter(worker.adapter_state(), 2)
    without = engine.generate(prompts, greedy)
    stats_nv = gap_stats(worker, prompts, without)
    moved = max(abs(a - b) for p, q in zip(with_vision, without) for a, b in zip(p[0].logprobs, q[0].logprobs))
    tokens_changed = sum(p[0].token_ids != q[0].token_ids for p, q in zip(with_vision, without))
    results["engine"]["vision_load"] = engine.vision_load
    check(
        "vision_lora_served",
        stats_nv["gap_max"] < args.max_gap and (moved > stats["gap_max"] or tokens_changed > 0),
        logprob_moved_max=moved,
        answers_changed=tokens_changed,
        parity_without_vision=stats_nv,
    )

    # 2: whole multi-turn episodes, greedy
    set_lora_b(worker, seed=2, scale=0.3)
    engine.update_adapter(worker.adapter_state(), 3)
    tasks = [split[i] for i in range(8)]
    episodes = run_episodes(engine, worker.chat, cfg.env, tasks, 1, greedy, cfg.rollout.max_model_len)
    seqs = [e.sequence for e in episodes]
    with torch.no_grad():
        scored = worker.policy.score_no_grad(seqs)
    gaps = []
    for seq, lp in zip(seqs, scored):
        mask = torch.tensor(seq.loss_mask[1:], dtype=torch.bool)
        gaps.append((lp[mask].float() - torch.tensor(seq.logprobs[1:])[mask]).abs())
    gap = torch.cat(gaps)
    check(
        "multi_turn_parity",
        float(gap.max()) < args.max_gap,
        gap_mean=float(gap.mean()),
        gap_max=float(gap.max()),
        images_per_episode_max=max(len(s.images) for s in seqs),
        tokens=int(gap.numel()),
    )

    # 4: a real optimizer step on vLLM-sampled episodes
    before = engine.generate(prompts[:4], greedy)
    sampled = run_episodes(
        engine,
        worker.chat,
        cfg.env.model_copy(update={"max_turns": 2}),
        [split[0], split[1]],
        4,
        worker.sampling_params(seed=5),
        cfg.rollout.max_model_len,
    )
    worker.update(sampled, [1.0 if i % 2 else -1.0 for i in range(len(sampled))], seed=0)
    sync_s = engine.update_adapter(worker.adapter_state(), 4)
    after = engine.generate(prompts[:4], greedy)
    stats_after = gap_stats(worker, prompts[:4], after)
    changed = max(abs(a - b) for p, q in zip(before, after) for a, b in zip(p[0].logprobs, q[0].logprobs))
    check(
        "serves_updated_adapter",
        stats_after["gap_max"] < args.max_gap and changed > stats_after["gap_max"],
        changed=changed,
        sync_s=sync_s,
        **stats_after,
    )

    # 5: no stale adapter
    seen = []
    for k, seed in enumerate([10, 11, 10, 12]):
        set_lora_b(worker, seed=seed, scale=0.3)
        engine.update_adapter(worker.adapter_state(), 100 + k)
        out = engine.generate(prompts[:4], greedy)
        seen.append([(c[0].token_ids, c[0].logprobs) for c in out])

    def same(a, b):
        return all(x[0] == y[0] and max(abs(u - v) for u, v in zip(x[1], y[1])) < 1e-3 for x, y in zip(a, b))

    check(
        "no_stale_adapter",
        same(seen[0], seen[2]) and not same(seen[0], seen[1]) and not same(seen[2], seen[3]),
        loras_loaded=sorted(engine.llm.llm_engine.list_loras()),
        sync_times=engine.sync_times[-4:],
    )

    # 6: sleep frees memory, wake restores it
    if not gpu:
        engine.close()
        Path(args.out).write_text(json.dumps({**results, "failures": failures}, indent=2) + "\n")
        return 1 if failures else 0
    torch.cuda.synchronize()
    free_awake = torch.cuda.mem_get_info()[0]
    t = time.perf_counter()
    engine.sleep()
    sleep_s = time.perf_counter() - t
    free_asleep = torch.cuda.mem_get_info()[0]
    t = time.perf_counter()
    engine.wake_up()
    wake_s = time.perf_counter() - t
    free_woken = torch.cuda.mem_get_info()[0]
    again = engine.generate(prompts[:4], greedy)
    check(
        "sleep_wake",
        free_asleep - free_awake > 0.5 * results["engine"]["vllm_gib"] * GIB
        and same(seen[3], [(c[0].token_ids, c[0].logprobs) for c in again]),
        freed_gib=(free_asleep - free_awake) / GIB,
        restored_gib=(free_asleep - free_woken) / GIB,
        sleep_s=sleep_s,
        wake_s=wake_s,
        engine_gib=results["engine"]["vllm_gib"],
    )
    engine.close()
    results["failures"] = failures
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "checks"}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
