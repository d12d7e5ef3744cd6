"""LoRA on the vision tower, for engines that only apply LoRA to the language model.

vLLM (0.24 through at least 0.32) ignores adapter tensors on the vision tower without a word
(vllm-project/vllm#32541): an adapter trained with `model.lora.include_vision` would be served as
another policy than the one trained and evaluated. Two ways around it, both exact:

- the rollout engine merges the vision half into its served weights after every sync
  (`rollout/vllm_engine.py`, `merged_vision_weights`); with `rollout.lora_mode=merged` it merges
  the whole adapter, language model included, the same way (`lora_pairs`, `merge_lora`);
- for serving, `vlrl model merge-vision` writes a new base (the old one with the adapter's vision
  half merged: W + scale * B @ A) and the language-model half as an adapter of that base, with
  the new base's fingerprint, so `vlrl serve` checks it like any other adapter
  (`merge_vision_into_base`). `vlrl serve` refuses an adapter with vision-tower LoRA and names
  this command.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from vlrl.errors import VlrlError

_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")


def is_vision_key(name: str) -> bool:
    """True for adapter or checkpoint tensor names inside the vision tower (`...visual....`)."""
    return ".visual." in f".{name}"


def split_adapter_state(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(language-model tensors, vision-tower tensors) of a PEFT adapter state dict."""
    language = {k: v for k, v in state.items() if not is_vision_key(k)}
    vision = {k: v for k, v in state.items() if is_vision_key(k)}
    return language, vision


def lora_pairs(state: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{checkpoint weight name: (lora_A, lora_B)} of a PEFT adapter state dict (any module).

    `base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight` belongs to the checkpoint
    tensor `model.visual.blocks.0.attn.qkv.weight`, `...language_model.layers.0.self_attn.q_proj.lora_B.weight`
    to `model.language_model.layers.0.self_attn.q_proj.weight`.
    """
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        match = _LORA_KEY.match(name)
        if match is None:
            raise VlrlError(f"adapter tensor {name!r} is not a LoRA A/B weight; cannot merge it")
        halves.setdefault(f"{match.group('module')}.weight", {})[match.group("which")] = tensor
    pairs = {}
    for weight, ab in halves.items():
        if set(ab) != {"A", "B"}:
            raise VlrlError(f"adapter has only lora_{''.join(ab)} for {weight}; it needs both A and B")
        pairs[weight] = (ab["A"], ab["B"])
    return pairs


def vision_lora_pairs(vision_state: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """`lora_pairs` of the vision half of an adapter (from `split_adapter_state`)."""
    return lora_pairs(vision_state)


def lora_scale(lora_config: dict[str, Any]) -> float:
    """PEFT's scaling of B @ A: alpha / r, or alpha / sqrt(r) with rsLoRA."""
    rank, alpha = float(lora_config["r"]), float(lora_config.get("lora_alpha", lora_config["r"]))
    return alpha / rank**0.5 if lora_config.get("use_rslora") else alpha / rank


def merge_lora(
    base: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale: float,
    name: str = "weight",
    dtype=None,
    factor_dtype=torch.float32,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """W0 + scale * B @ A, accumulated in fp32 on the base's device and rounded once to `dtype`
    (default: the base's), into `out` when given (e.g. the served parameter itself). Always from
    the untouched base W0: merging onto an already merged, rounded weight would let the rounding
    errors pile up step after step.

    `factor_dtype`: the dtype A and B enter the product in, the one the trainer's forward uses
    (`model.lora.compute_dtype`: under a bf16 base's autocast the fp32 master A and B are cast to
    bf16 there too). When it is the 16-bit dtype of the base and of the result on a GPU, the merge
    is one GEMM with W0 in its epilogue (`addmm`: cuBLAS accumulates B @ A in fp32, adds W0 in fp32
    and rounds once on the store), so no fp32 product of the size of the weight is written and
    read back; elsewhere, an fp32 product and one fused add."""
    dtype = dtype or base.dtype
    if (b.shape[0], a.shape[1]) != tuple(base.shape) or b.shape[1] != a.shape[0]:
        raise VlrlError(f"LoRA for {name} has shape {(b.shape[0], a.shape[1])}, the base weight {tuple(base.shape)}")
    if out is None:
        out = torch.empty(base.shape, dtype=dtype, device=base.device)
    elif out.dtype != dtype or tuple(out.shape) != tuple(base.shape):
        raise VlrlError(f"cannot merge {name} into a {out.dtype} tensor of shape {tuple(out.shape)}")
    if base.is_cuda and factor_dtype in (torch.bfloat16, torch.float16) and base.dtype == dtype == factor_dtype:
        a = a.to(device=base.device, dtype=factor_dtype)
        b = b.to(device=base.device, dtype=factor_dtype)
        # The inner dimension is the LoRA rank (8-128), far too short for cuBLAS to split it and
        # sum the partial products in 16 bits (what `allow_bf16_reduced_precision_reduction` allows).
        return torch.addmm(base, b, a, alpha=scale, out=out)
    a = a.to(device=base.device, dtype=torch.float32)
    b = b.to(device=base.device, dtype=torch.float32)
    if factor_dtype != torch.float32:  # the trainer's rounding of A and B, on a CPU or an fp32 base
        a, b = a.to(factor_dtype).float(), b.to(factor_dtype).float()
    # One fused pass over the weight: add() computes base + scale * delta in fp32 (the promoted
    # dtype) and rounds once on the store into `out`, so no fp32 copy of the base is made and the
    # scale needs no pass of its own.
    return torch.add(base, b @ a, alpha=scale, out=out)


def merged_weights(
    base: dict[str, torch.Tensor], pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], lora_config: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """Base weights with the LoRA `pairs` (from `lora_pairs`) merged in (`merge_lora`); every
    pair's weight must be in `base`."""
    scale = lora_scale(lora_config)
    out = {}
    for name, (a, b) in pairs.items():
        if name not in base:
            raise VlrlError(f"the base checkpoint has no tensor {name}; the adapter's LoRA does not fit it")
        out[name] = merge_lora(base[name], a, b, scale, name)
    return out


def merged_vision_weights(
    base: dict[str, torch.Tensor], pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], lora_config: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """`merged_weights` for the vision half (kept for `merge_vision_into_base` and callers)."""
    return merged_weights(base, pairs, lora_config)


def _checkpoint_files(model_dir: str | os.PathLike) -> list[Path]:
    """The safetensors files of a checkpoint directory (one file or sharded), in name order."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise VlrlError(f"{model_dir} has no *.safetensors files; cannot read the base weights")
    return files


def read_checkpoint_tensors(
    model_dir: str | os.PathLike, names: set[str], device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """The named tensors of a safetensors checkpoint directory (one file or sharded), on `device`."""
    from safetensors import safe_open

    found: dict[str, torch.Tensor] = {}
    for file in _checkpoint_files(model_dir):
        with safe_open(str(file), framework="pt", device=str(device)) as handle:
            for name in set(handle.keys()) & (names - set(found)):
                found[name] = handle.get_tensor(name)
    missing = sorted(names - set(found))
    if missing:
        raise VlrlError(f"{model_dir} lacks {len(missing)} base tensors the LoRA needs (e.g. {missing[0]})")
    return found


def checkpoint_tensor_names(model_dir: str | os.PathLike) -> list[str]:
    """Every tensor name of a safetensors checkpoint directory (one file or sharded), from the headers."""
    from safetensors import safe_open

    names: set[str] = set()
    for file in _checkpoint_files(model_dir):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            names.update(handle.keys())
    return sorted(names)


def adapter_tensor_names(adapter_dir: str | Path) -> list[str]:
    """Tensor names of a PEFT adapter directory's adapter_model.safetensors (read from the header)."""
    from safetensors import safe_open

    path = Path(adapter_dir) / "adapter_model.safetensors"
    if not path.is_file():
        raise VlrlError(f"{adapter_dir} has no adapter_model.safetensors")
    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except Exception as exc:  # safetensors' own error type for a damaged header
        raise VlrlError(
            f"cannot read {path}: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
        ) from None


def vision_tensor_count(adapter_dir: str | Path) -> int:
    """How many of an adapter's tensors sit on the vision tower."""
    return sum(is_vision_key(name) for name in adapter_tensor_names(adapter_dir))


def merge_vision_into_base(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path) -> tuple[Path, Path]:
    """Write OUT/base (the base with the adapter's vision LoRA merged) and OUT/adapter (the
    language-model half, recording OUT/base's fingerprint); returns both paths.

    The base must be the one the adapter was trained on (its fingerprint is checked). Files other
    than the weights (config, tokenizer, processor) are copied; each safetensors file keeps its
    name, so a sharded checkpoint stays sharded. Written aside and renamed: a failure leaves no
    half-written OUT.
    """
    from safetensors.torch import load_file, save_file

    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.lora import ADAPTER_RECORD, lora_target_regex, read_adapter_record

    base_dir, adapter_dir, out = Path(base_dir), Path(adapter_dir), Path(out_dir)
    if not (base_dir / "config.json").is_file():
        raise VlrlError(f"base model {base_dir} has no config.json; pass the directory the adapter was trained on")
    record = read_adapter_record(adapter_dir)
    base_fp = model_fingerprint(base_dir)
    if record.get("base_fingerprint") != base_fp:
        raise VlrlError(
            f"adapter {adapter_dir} was trained on base {record.get('base_fingerprint')}, not {base_dir} ({base_fp})"
        )
    if out.exists():
        raise VlrlError(f"{out} exists; choose a new output directory (nothing was written)")
    state = load_file(str(adapter_dir / "adapter_model.safetensors"))
    language, vision = split_adapter_state(state)
    if not vision:
        raise VlrlError(f"adapter {adapter_dir} has no LoRA on the vision tower; serve it as it is")
    lora_config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    pairs = vision_lora_pairs(vision)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "base").mkdir(parents=True)
        merged_names: set[str] = set()
        for item in base_dir.iterdir():
            if item.suffix == ".safetensors":
                tensors = load_file(str(item))
                here = {name: pair for name, pair in pairs.items() if name in tensors}
                tensors.update(merged_vision_weights(tensors, here, lora_config))
                merged_names |= set(here)
                save_file(tensors, str(tmp / "base" / item.name), metadata={"format": "pt"})
            elif item.is_file():
                shutil.copy2(item, tmp / "base" / item.name)
        missing = sorted(set(pairs) - merged_names)
        if missing:
            raise VlrlError(
                f"the base checkpoint has no tensor {missing[0]}; the adapter's vision LoRA does not fit it"
            )
        (tmp / "adapter").mkdir()
        save_file(
            {k: v.contiguous() for k, v in language.items()},
            str(tmp / "adapter" / "adapter_model.safetensors"),
            metadata={"format": "pt"},
        )
        leaves = sorted({m.group("module").rsplit(".", 1)[-1] for k in language if (m := _LORA_KEY.match(k))})
        lm_config = {**lora_config, "target_modules": lora_target_regex(leaves, include_vision=False)}
        (tmp / "adapter" / "adapter_config.json").write_text(json.dumps(lm_config, indent=2) + "\n", encoding="utf-8")
        new_record = {
            **record,
            "base_fingerprint": model_fingerprint(tmp / "base"),
            "derived_from": {
                "adapter": str(adapter_dir.resolve()),
                "base_fingerprint": base_fp,
                "vision_tensors_merged": len(vision),
            },
        }
        (tmp / "adapter" / ADAPTER_RECORD).write_text(json.dumps(new_record, indent=2) + "\n", encoding="utf-8")
        for name in ("vlrl_lineage.json",):  # what produced the adapter travels with its language half
            if (adapter_dir / name).is_file():
                shutil.copy2(adapter_dir / name, tmp / "adapter" / name)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / "base", out / "adapter"
