#!/usr/bin/env python
"""What the vision-feature cache saves in the fast path's prefill, turn by turn.

Plays N oracle episodes of a config (default: the GPU recipe's 9x9 block mazes, up to 18 turns)
and, at each turn, runs the transformers engine's prefill (`_StaticDecoder._prefill`, the one the
fast path does before decoding) over the conversations still running, as a rollout does:

  uncached  `vision_cache_mb=0`: every turn collates every image's pixels and the vision tower
            re-encodes all of them (the path before the cache)
  cached    the default cache: only images not seen before are collated, moved and encoded

It reports seconds per turn, bytes of pixels collated and moved to the device, images encoded,
and the largest difference of the two modes' last-position logits (they should agree to fp32
rounding).

    python bench/prefill_vision_cache.py --episodes 8 --threads 1 --out prefill.json      # CPU
    python bench/prefill_vision_cache.py --episodes 64 --device cuda --out prefill.json   # one GPU
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))

if str(ROOT / "bench") not in sys.path:  # per_image_overhead's set-up, also when loaded by path (tests)
    sys.path.insert(0, str(ROOT / "bench"))

from per_image_overhead import bench_parser, bench_setup  # noqa: E402

from vlrl.envs.base import make_env  # noqa: E402
from vlrl.models.loading import load_policy_model  # noqa: E402
from vlrl.rollout.sequence import ChatFormat  # noqa: E402
from vlrl.rollout.static_decoder import StaticDecoder  # noqa: E402


def oracle_turns(config, chat: ChatFormat, tasks, max_turns: int) -> list[list]:
    """The prompts of each turn: turn t holds the conversations still running, each as it stands
    before its t-th response (copies that share the earlier turns' pixel tensors, as in a rollout)."""
    envs = [make_env(config.env) for _ in tasks]
    seqs = [chat.prompt(env.system_prompt, env.reset(task)) for env, task in zip(envs, tasks)]
    running = list(range(len(tasks)))
    turns = []
    tok = chat.tokenizer
    while running and len(turns) < max_turns:
        turns.append([seqs[i].copy() for i in running])
        still = []
        for i in running:
            text = envs[i].oracle_response()
            ids = tok(text, add_special_tokens=False)["input_ids"] + [chat.eos_id]
            seqs[i].append_sampled(ids, [0.0] * len(ids))
            result = envs[i].step(text)
            if not result.done:
                seqs[i].extend(chat.observation_piece(result.observation, response_ended=True))
                still.append(i)
        running = still
    return turns


def main(argv: list[str] | None = None) -> dict:
    ap = bench_parser(__doc__.splitlines()[0], episodes=8)
    ap.add_argument("--max-turns", type=int, default=None, help="stop after this many turns (default: the config's)")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config, model_dir, processor, tasks = bench_setup(args)
    pad = processor.tokenizer.pad_token_id or 0
    turns = oracle_turns(config, ChatFormat(processor), tasks, args.max_turns or config.env.max_turns)
    model = load_policy_model(model_dir, dtype=args.dtype).to(device).eval()

    modes = {"uncached": 0, "cached": None}
    decoders = {mode: StaticDecoder(model, vision_cache_mb=mb) for mode, mb in modes.items()}
    rows: dict[str, list[dict]] = {mode: [] for mode in modes}
    last_logits: dict[str, list[torch.Tensor]] = {mode: [] for mode in modes}
    with torch.no_grad():
        StaticDecoder(model, vision_cache_mb=0)._prefill(turns[0][:1], pad, device)  # warm-up, not counted
        for t, prompts in enumerate(turns):
            # The modes take turns going first, so neither always runs on a cold cache or allocator.
            for mode in list(modes) if t % 2 == 0 else list(modes)[::-1]:
                decoder = decoders[mode]
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                logits, _, _, _ = decoder._prefill(prompts, pad, device)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds = time.perf_counter() - t0
                last_logits[mode].append(logits.float().cpu())
                rows[mode].append(
                    {
                        "conversations": len(prompts),
                        "tokens": sum(len(p) for p in prompts),
                        "seconds": round(seconds, 4),
                        **decoder.vision_stats,
                    }
                )
    cache = decoders["cached"].vision_cache
    cache_info = {
        "max_bytes": cache.max_bytes,
        "bytes": cache.bytes,
        "entries": len(cache.entries),
        "hits": cache.hits,
        "misses": cache.misses,
        "invalidations": cache.invalidations,
    }
    worst = max(float((a - b).abs().max()) for a, b in zip(last_logits["uncached"], last_logits["cached"]))
    totals = {
        mode: {
            "seconds": round(sum(r["seconds"] for r in rs), 3),
            "pixel_bytes": sum(r["pixel_bytes"] for r in rs),
            "images_encoded": sum(r["encoded"] for r in rs),
        }
        for mode, rs in rows.items()
    }
    result = {
        "command": "python bench/prefill_vision_cache.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "device": str(device),
        "threads": args.threads,
        "dtype": args.dtype,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "config": args.config,
        "model": config.model.init_tiny,
        "episodes": len(tasks),
        "turns": len(turns),
        "max_abs_logit_diff": worst,
        "totals": totals,
        "cache": cache_info,
        "per_turn": rows,
    }
    print(
        f"{len(tasks)} episodes, {len(turns)} turns ({config.model.init_tiny}, {args.dtype} on {device}, "
        f"{args.threads} threads)"
    )
    print("turn  convs  images | uncached s  pixel MB | cached s  pixel MB  encoded")
    for t, (u, c) in enumerate(zip(rows["uncached"], rows["cached"]), start=1):
        print(
            f"{t:4d}  {u['conversations']:5d}  {u['images']:6d} | "
            f"{u['seconds']:10.3f}  {u['pixel_bytes'] / 2**20:8.1f} |"
            f" {c['seconds']:8.3f}  {c['pixel_bytes'] / 2**20:8.1f}  {c['encoded']:7d}"
        )
    for mode, tot in totals.items():
        print(
            f"{mode:9s} total {tot['seconds']:.2f} s, {tot['pixel_bytes'] / 2**20:.1f} MiB of pixels, "
            f"{tot['images_encoded']} images encoded"
        )
    print(f"largest |logit difference| between the modes: {worst:.2e}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
