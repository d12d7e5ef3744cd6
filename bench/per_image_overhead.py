#!/usr/bin/env python
"""What a Python loop per image costs: transformers' stock Qwen3-VL paths against vlrl's batched ones.

A multi-turn maze episode holds one image per turn. This runs the same batch of oracle-played
episodes of a config (default: the GPU recipe's 9x9 block mazes, up to 18 turns) through

  sft      one SFT forward + backward (`sft_loss`)
  score    one scoring forward without gradients (what the GRPO update's passes do)
  encode   building every observation piece (`ChatFormat`): the processor's call, or the direct path

in the `stock` mode (transformers' own M-RoPE `get_rope_index`, per-image vision attention, the
processor's call) and the `batched` mode (`vlrl.models.qwen_vl_batched`, ChatFormat's direct path),
and reports for each: aten operator calls (views and other metadata ops left out: roughly one
kernel launch each on a GPU), host synchronisations (`aten::item` / `_local_scalar_dense`), wall
seconds, and that both modes computed the same loss. On a CPU the arithmetic dominates the wall
time; the operator and sync counts are what a GPU pays per call whatever the model's size.

    python bench/per_image_overhead.py --episodes 16 --out overhead.json                 # CPU, maze9
    python bench/per_image_overhead.py --episodes 64 --device cuda --out overhead.json    # one GPU
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))

from torch.profiler import ProfilerActivity, profile  # noqa: E402

from vlrl.config import load_config  # noqa: E402
from vlrl.envs.base import build_split  # noqa: E402
from vlrl.models.loading import ensure_model, load_policy_model, vision_special_token_ids  # noqa: E402
from vlrl.models.processor import load_processor  # noqa: E402
from vlrl.models.qwen_vl_batched import spatial_merge_size, use_batched_vision, with_position_ids  # noqa: E402
from vlrl.rollout.sequence import ChatFormat, collate  # noqa: E402
from vlrl.training.sft import oracle_transcript, sft_loss  # noqa: E402

# Operators that only make views or metadata (no kernel on a GPU).
_VIEWS = {
    "aten::as_strided",
    "aten::transpose",
    "aten::view",
    "aten::slice",
    "aten::narrow",
    "aten::select",
    "aten::expand",
    "aten::unsqueeze",
    "aten::reshape",
    "aten::flatten",
    "aten::unbind",
    "aten::split",
    "aten::split_with_sizes",
    "aten::squeeze",
    "aten::t",
    "aten::permute",
    "aten::alias",
    "aten::detach",
    "aten::_unsafe_view",
    "aten::lift_fresh",
    "aten::resize_",
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::result_type",
    "aten::to",
    "aten::chunk",
    "aten::contiguous",
    "aten::_reshape_alias",
}
_SYNCS = {"aten::item", "aten::_local_scalar_dense"}


def _count(fn, device: torch.device) -> dict:
    fn()  # warm-up (lazy initialisation, allocator)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
    events = prof.key_averages()
    ops = sum(e.count for e in events if e.key.startswith("aten::") and e.key not in _VIEWS)
    syncs = sum(e.count for e in events if e.key == "aten::_local_scalar_dense")
    return {"aten_ops": ops, "host_syncs": syncs, "seconds": round(seconds, 4), "value": result}


def bench_parser(description: str, episodes: int) -> argparse.ArgumentParser:
    """The options the maze-model benches share (a model preset built offline, oracle episodes)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", default="configs/gpu-maze9.yaml")
    ap.add_argument("--model", default=None, help="tiny preset (default: the config's model.init_tiny)")
    ap.add_argument("--model-dir", default="runs/models/overhead-{model}")
    ap.add_argument("--episodes", type=int, default=episodes)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    return ap


def bench_setup(args) -> tuple:
    """What the maze-model benches share: the config (model.path from --model-dir and the preset),
    the model built offline if missing, its processor, and the first --episodes training tasks."""
    overrides = [f"model.init_tiny={args.model}"] if args.model else []
    config = load_config(args.config, overrides)
    preset = config.model.init_tiny
    config = load_config(args.config, overrides + [f"model.path={args.model_dir.format(model=preset)}"])
    model_dir = ensure_model(config.model)
    processor = load_processor(model_dir)
    split = build_split(config.env, "train")
    return config, model_dir, processor, [split[i] for i in range(args.episodes)]


def main(argv: list[str] | None = None) -> dict:
    args = bench_parser(__doc__.splitlines()[0], episodes=16).parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config, model_dir, processor, tasks = bench_setup(args)

    rows: dict[str, dict] = {}
    sequences = {}
    for mode in ("stock", "batched"):
        chat = ChatFormat(processor)
        if mode == "stock":
            chat._direct = False  # the processor's call for every piece
        rng = random.Random(0)
        t0 = time.perf_counter()
        sequences[mode] = [oracle_transcript(config, chat, task, rng) for task in tasks]
        pieces = sum(len(s.images) for s in sequences[mode])
        rows[f"encode/{mode}"] = {
            "pieces": pieces,
            "seconds": round(time.perf_counter() - t0, 4),
            "ms_per_piece": round(1000 * (time.perf_counter() - t0) / pieces, 3),
        }
    same_tokens = all(a.token_ids == b.token_ids for a, b in zip(sequences["stock"], sequences["batched"]))

    model = load_policy_model(model_dir, dtype="float32").to(device)
    stock = copy.deepcopy(model)
    use_batched_vision(stock, enabled=False)
    suppress = vision_special_token_ids(processor)
    merge = spatial_merge_size(model)
    pad = processor.tokenizer.pad_token_id or 0
    seqs = sequences["batched"]
    # The closures below run inside their own iteration, so binding the loop variables late is what is meant.
    for mode, m in (("stock", stock), ("batched", model)):

        def batch():
            b = collate(seqs, pad, side="right")
            return with_position_ids(b, merge) if mode == "batched" else b  # noqa: B023

        def sft_step():
            m.zero_grad(set_to_none=True)  # noqa: B023
            b = {k: v.to(device) for k, v in batch().items()}
            loss = sft_loss(m, b, suppress)  # noqa: B023
            loss.backward()
            return float(loss.detach())

        @torch.no_grad()
        def score():
            b = {k: v.to(device) for k, v in batch().items()}
            return float(sft_loss(m, b, suppress))  # noqa: B023

        rows[f"sft/{mode}"] = _count(sft_step, device)
        rows[f"score/{mode}"] = _count(score, device)
    images = sum(len(s.images) for s in seqs)
    result = {
        "command": "python bench/per_image_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "config": args.config,
        "model": config.model.init_tiny,
        "episodes": len(seqs),
        "images": images,
        "tokens": sum(len(s) for s in seqs),
        "same_tokens_both_encodings": same_tokens,
        "rows": rows,
    }
    for phase in ("sft", "score"):
        a, b = rows[f"{phase}/stock"], rows[f"{phase}/batched"]
        result[f"{phase}_same_loss"] = abs(a["value"] - b["value"]) <= 1e-5 * max(1.0, abs(a["value"]))
    print(f"{len(seqs)} episodes, {images} images, {result['tokens']} tokens ({config.model.init_tiny} on {device})")
    for name, row in rows.items():
        print(f"  {name:16s} " + "  ".join(f"{k} {v}" for k, v in row.items()))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
