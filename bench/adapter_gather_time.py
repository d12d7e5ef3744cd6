"""Python time of gathering the adapter for a merging engine, at the Qwen3-VL-8B shape, on the meta
device (no weights: what is timed is the walk over the model, which is the same on any device).

PEFT's state-dict path (`vlrl.models.lora.adapter_state_dict`, what the sync called before) against
`vlrl.runtime.distributed.gather_adapter_state(to_cpu=False)` (PEFT's key mapping cached per set of
LoRA parameter names).

usage: python bench/adapter_gather_time.py [--repeats 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
from transformers import Qwen3VLForConditionalGeneration

from vlrl.models.lora import adapter_state_dict, apply_lora
from vlrl.models.tiny import TINY_SPECS, build_tokenizer, tiny_config
from vlrl.runtime.distributed import gather_adapter_state


def mean_ms(fn, repeats: int) -> float:
    fn()  # the first call builds what the path caches
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(tiny_config(TINY_SPECS["qwen3vl-8b-shape"], build_tokenizer()))
    model = apply_lora(model, args.rank, 2 * args.rank)
    peft_state = adapter_state_dict(model, to_cpu=False)
    gathered = gather_adapter_state(model, to_cpu=False)
    result = {
        "model": "qwen3vl-8b-shape (meta device)",
        "lora_rank": args.rank,
        "lora_tensors": len(peft_state),
        "same_keys": peft_state.keys() == gathered.keys(),
        "peft_state_dict_ms": mean_ms(lambda: adapter_state_dict(model, to_cpu=False), args.repeats),
        "gather_adapter_state_ms": mean_ms(lambda: gather_adapter_state(model, to_cpu=False), args.repeats),
        "repeats": args.repeats,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
