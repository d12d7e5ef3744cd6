"""`vlrl model ...`: build tiny offline models and inspect model directories."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import get_args

import typer
from rich.console import Console
from rich.table import Table

from vlrl.config import TinyPreset

app = typer.Typer(help="Build and inspect policy models (local directories only).", no_args_is_help=True)
console = Console()


# The presets of `build_tiny_model`, from the one list (a hand-kept copy here had missed maze9).
TinySizeChoice = Enum("TinySizeChoice", {name.replace("-", "_"): name for name in get_args(TinyPreset)}, type=str)


def _quiet_transformers() -> None:
    """Hide transformers' weight-loading/saving progress bars; the CLI shows its own status."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _params_table(title: str, counts: dict[str, int]) -> Table:
    table = Table(title=title, show_header=False)
    for key in ("total", "vision", "language"):
        table.add_row(f"{key} parameters", f"{counts[key]:,}")
    return table


@app.command("init-tiny")
def init_tiny(
    out: Path = typer.Argument(..., help="Directory to create (must not exist or be empty)."),
    size: TinySizeChoice = typer.Option(
        "ci",
        "--size",
        help="ci: <1M params for tests; demo: ~5M, learns a small maze; "
        "maze9: ~56M, the GPU recipe of 9x9 block mazes (configs/gpu-maze9.yaml); qwen3vl-2b-shape: Qwen3-VL-2B "
        "layer shapes (~1.8B, bf16, small vocabulary) for GPU runs; "
        "qwen3vl-8b-shape: Qwen3-VL-8B layer shapes and vocabulary (8.8B) for benchmarks.",
    ),
    seed: int = typer.Option(0, "--seed", help="Initialisation seed; the same seed gives identical weights."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT if it already holds files."),
) -> None:
    """Build a random tiny Qwen3-VL model with its own tokenizer, fully offline.

    Example: vlrl model init-tiny runs/models/tiny-demo --size demo --seed 0
    """
    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.loading import count_checkpoint_parameters
    from vlrl.models.tiny import build_tiny_model

    _quiet_transformers()
    with console.status(f"Building tiny Qwen3-VL ({size.value}, seed {seed}) in {out} ..."):
        path = build_tiny_model(out, size=size.value, seed=seed, overwrite=overwrite)
        fingerprint = model_fingerprint(path)
    console.print(f"[green]Built[/green] {path}")
    console.print(_params_table(f"tiny-{size.value}", count_checkpoint_parameters(path)))
    console.print(f"fingerprint: {fingerprint}", soft_wrap=True)


@app.command("pretrain-vision")
def pretrain_vision(
    config: Path = typer.Argument(
        ..., help="YAML run config: model.path (the tiny base), env (a maze env), train.vision_pretrain."
    ),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. train.vision_pretrain.steps=2000."),
    out: Path = typer.Option(..., "--out", "-o", help="New model directory (a new base, its own fingerprint)."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace OUT if it already holds files (never the base model)."
    ),
) -> None:
    """Train a tiny model's vision tower to see every maze square (wall, agent, goal, open moves).

    A stand-in for the pretrained vision tower a real checkpoint has: dense per-square labels,
    no paths or actions. Then SFT and GRPO start from OUT (model.path=OUT model.init_tiny=null).

    Example: vlrl model pretrain-vision configs/gpu-maze9.yaml -o runs/models/maze9-seeing
    """
    from vlrl.config import load_config
    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.training.vision_pretrain import pretrain_vision as run

    _quiet_transformers()
    cfg = load_config(config, overrides or [])
    with console.status(f"Pretraining the vision tower of {cfg.model.path} ..."):
        path = run(cfg, out, overwrite=overwrite)
    final = json.loads((path / "vlrl_vision_pretrain.json").read_text())["final"]
    console.print(
        f"[green]Wrote[/green] {path} after {final['step']} steps: holdout agent square exact "
        f"{final['agent_exact']:.1%}, free squares exact {final['free_squares_exact']:.1%}"
    )
    console.print(f"fingerprint: {model_fingerprint(path)}", soft_wrap=True)


@app.command("info")
def info(model_dir: Path = typer.Argument(..., help="A local model directory (config.json + safetensors).")) -> None:
    """Show a model directory's type, parameter counts, fingerprint and image settings.

    Parameter counts come from the safetensors headers, so this is quick even for large models.

    Example: vlrl model info runs/models/tiny-demo
    """
    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.loading import count_checkpoint_parameters, read_model_config
    from vlrl.models.processor import load_processor

    _quiet_transformers()
    config = read_model_config(model_dir)
    counts = count_checkpoint_parameters(model_dir)
    image_processor = load_processor(model_dir).image_processor
    size = image_processor.size

    table = _params_table(str(model_dir), counts)
    table.add_row("model type", config["model_type"])
    text = config.get("text_config", {})
    table.add_row("text hidden / layers", f"{text.get('hidden_size')} / {text.get('num_hidden_layers')}")
    table.add_row("vocab size", str(text.get("vocab_size")))
    table.add_row("patch size / merge", f"{image_processor.patch_size} / {image_processor.merge_size}")
    table.add_row("image min / max pixels", f"{size['shortest_edge']:,} / {size['longest_edge']:,}")
    console.print(table)
    console.print(f"fingerprint: {model_fingerprint(model_dir)}", soft_wrap=True)


@app.command("merge-vision")
def merge_vision(
    adapter: Path = typer.Argument(
        ..., help="An adapter directory with LoRA on the vision tower (model.lora.include_vision)."
    ),
    base: Path = typer.Option(..., "--base", help="The base model directory the adapter was trained on."),
    out: Path = typer.Option(
        ..., "--out", "-o", help="New directory: OUT/base (vision half merged) and OUT/adapter (language half)."
    ),
) -> None:
    """Split an adapter for serving: its vision-tower LoRA merged into a new base, the rest as an adapter of it.

    vLLM ignores LoRA on the vision tower, so `vlrl serve` refuses such adapters; served this way,
    the endpoint answers with exactly the trained policy. The new adapter records the new base's
    fingerprint and where it came from.

    Example: vlrl model merge-vision runs/demo/grpo/adapter --base runs/demo/sft-adapter -o runs/demo/grpo-serve
    """
    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.vision_merge import merge_vision_into_base

    _quiet_transformers()
    with console.status(f"Merging the vision half of {adapter} into a copy of {base} ..."):
        new_base, new_adapter = merge_vision_into_base(base, adapter, out)
    console.print(
        f"[green]Wrote[/green] {new_base} (fingerprint {model_fingerprint(new_base)}) and {new_adapter}", soft_wrap=True
    )
    console.print(f"serve with: vlrl serve --base {new_base} --adapter NAME={new_adapter}", soft_wrap=True)
