"""`vlrl bench`: the GRPO step benchmark (bench/grpo_bench.py of a source checkout).

The harness lives in `bench/` beside `src/`, with the other benchmarks, because it is a developer
tool with a benchmark-only dependency (TRL, the `bench` extra); this command finds it relative
to the installed package, so it needs an editable install of a checkout (`pip install -e .`).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import typer

from vlrl.errors import VlrlError

HARNESS = Path(__file__).resolve().parents[3] / "bench" / "grpo_bench.py"


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


def load_harness(path: Path = HARNESS) -> ModuleType:
    """Import bench/grpo_bench.py (a file of the checkout, not a module of the package)."""
    if not path.is_file():
        raise VlrlError(
            f"vlrl bench runs {path.name} from a source checkout, and there is none at {path}; "
            "run it from a clone installed with `pip install -e .`"
        )
    name = "vlrl_grpo_bench"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _ints(text: str, option: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise VlrlError(f"{option} takes comma-separated integers, got {text!r}") from None


def bench(
    model: str = typer.Option(
        "qwen3vl-8b-shape", "--model", help="Tiny preset (built in memory, nothing downloaded) or a model directory."
    ),
    device: str = typer.Option("auto", "--device", help="auto (cuda when available), cuda, cuda:1, cpu."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="float32 | bfloat16 | float16."),
    prompts: int = typer.Option(8, "--prompts", min=1, help="Prompts (maze tasks) per step."),
    samples: int = typer.Option(8, "--samples", min=2, help="Completions per prompt (GRPO group size)."),
    new_tokens: int = typer.Option(
        128, "--new-tokens", min=1, help="Tokens per completion (forced: end-of-turn is never sampled)."
    ),
    micro_batch: int = typer.Option(16, "--micro-batch", min=1, help="Sequences per forward/backward."),
    lora_rank: int = typer.Option(32, "--lora-rank", min=1, help="LoRA rank on the language model's projections."),
    maze_size: int = typer.Option(5, "--maze-size", min=3, help="Maze cells per side (maze_plan task)."),
    cell_px: int = typer.Option(45, "--cell-px", min=4, help="Pixels per cell (5 x 45 = 225 px)."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Steps run first and not counted."),
    steps: int = typer.Option(3, "--steps", min=1, help="Measured steps."),
    engine: str = typer.Option(
        "transformers",
        "--engine",
        help="vlrl's rollout engine: transformers | vllm (colocated, asleep during the update).",
    ),
    gpu_memory_utilization: str = typer.Option(
        "0.35", "--gpu-memory-utilization", help="vllm (and TRL's colocated vLLM): share of the GPU, or auto."
    ),
    trl_vllm: bool = typer.Option(
        False,
        "--trl-vllm",
        help="With --compare trl: TRL generates with its colocated vLLM (use_vllm=True, vllm_mode=colocate).",
    ),
    fast_decode: str = typer.Option(
        "auto",
        "--fast-decode",
        help="Rollout path: auto (static-cache decoder on CUDA) | on | off (transformers generate).",
    ),
    compile_decode: bool = typer.Option(False, "--compile-decode", help="Also torch.compile the decode step (CUDA)."),
    decode_sweep: str = typer.Option(
        "", "--decode-sweep", help="Also time rollouts alone at these batch sizes, e.g. 64,256."
    ),
    compare: str = typer.Option(
        "",
        "--compare",
        help="`trl` (transformers generation) and/or `trl-vllm` (its colocated vLLM), comma-separated: run TRL's "
        "GRPOTrainer on the same workload in the same run (needs the bench extra).",
    ),
    peak_tflops: float = typer.Option(
        790.0, "--peak-tflops", min=1e-6, help="The device's dense bf16 peak for the update's MFU (H200: ~790)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and the sampling."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write the full result (every step, every phase) as JSON."
    ),
) -> None:
    """Time GRPO steps of the reference workload (issue 10) and print s/step, throughputs, phases, MFU and memory.

    The steps are the product's own: `GRPOTrainer.step` with one local worker (its time/* record).

    Example (one GPU): vlrl bench --compare trl --decode-sweep 64,256 -o bench.json
    Example (one GPU, vLLM on both sides): vlrl bench --engine vllm --compare trl,trl-vllm --decode-sweep 64,256
    Example (CPU smoke): vlrl bench --model ci --device cpu --dtype float32 --prompts 2 --samples 2 --new-tokens 8
    --cell-px 16 --maze-size 3
    """
    if engine not in ("transformers", "vllm"):
        raise VlrlError(f"--engine {engine!r}: use transformers or vllm")
    if fast_decode not in ("auto", "on", "off"):
        raise VlrlError(f"--fast-decode {fast_decode!r}: use auto, on or off")
    targets = [c for c in compare.split(",") if c.strip()]
    if any(t not in ("trl", "trl-vllm") for t in targets):
        raise VlrlError(f"--compare {compare!r}: the comparisons are trl and trl-vllm")
    harness = load_harness()
    settings = harness.BenchSettings(
        model=model,
        device=device,
        dtype=dtype,
        prompts=prompts,
        samples=samples,
        new_tokens=new_tokens,
        micro_batch=micro_batch,
        lora_rank=lora_rank,
        lora_alpha=2.0 * lora_rank,
        maze_size=maze_size,
        cell_px=cell_px,
        warmup=warmup,
        steps=steps,
        fast_decode=fast_decode,
        compile_decode=compile_decode,
        decode_sweep=_ints(decode_sweep, "--decode-sweep"),
        compare=targets,
        seed=seed,
        engine=engine,
        gpu_memory_utilization=gpu_memory_utilization,
        trl_vllm=trl_vllm,
        peak_tflops=peak_tflops,
    )
    result = harness.run(settings)
    typer.echo(harness.format_table(result))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        typer.echo(f"wrote {out}")
