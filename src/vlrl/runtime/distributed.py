"""torch.distributed and FSDP2 for the workers of one run.

With more than one worker every worker holds an FSDP2 shard of the LoRA policy: `fully_shard`
on each vision block and each language-model decoder layer (the model's `_no_split_modules`),
then on the root. A forward pass all-gathers a block's weights and a backward pass
reduce-scatters its gradients, so every worker must run the same number of passes through the
same modules; the update plan (`vlrl.runtime.update_plan.make_update_plans`) guarantees that.

Adapter state leaves FSDP as a full (unsharded) dict keyed like the single-process model (LoRA
weights are small; every engine needs all of them anyway). Optimizer and LR-scheduler state go to
checkpoints through `torch.distributed.checkpoint` (DCP): every worker writes only the shard it
holds, and DCP's metadata lets any other number of workers (one included) read back exactly
their own shards, so checkpoints reshard (W -> W'). `optimizer_state` / `load_optimizer_state`
move the same state in memory as one full, name-keyed dict. Every function here works on an
unsharded model too.
"""

from __future__ import annotations

import collections
import socket
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from vlrl.errors import VlrlError


def free_port() -> int:
    """A TCP port that is free on this node now (for the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_process_group(
    rank: int, world_size: int, master_addr: str, master_port: int, device: torch.device, timeout_s: float
) -> None:
    """Join the run's process group: NCCL on GPU, gloo on CPU; rank 0's node hosts the rendezvous."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_policy(model: nn.Module, device: torch.device) -> nn.Module:
    """FSDP2: shard each transformer block (vision and language), then the root, onto `device`.

    Blocks are the classes the model lists in `_no_split_modules` (Qwen3-VL: the vision blocks and
    the text decoder layers). The parameters become DTensors, so build the optimizer afterwards.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    block_classes = set(getattr(base, "_no_split_modules", None) or [])
    if not block_classes:
        raise VlrlError(
            f"{type(base).__name__} lists no transformer block classes (_no_split_modules); cannot shard it with FSDP"
        )
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    blocks = [m for m in model.modules() if type(m).__name__ in block_classes]
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _adapter_names(model: nn.Module) -> dict[str, str]:
    """{parameter name in the model: key in a PEFT adapter state dict}, as PEFT itself maps them.

    PEFT's own function is run on placeholders (the parameter's position), so the mapping stays
    right for whatever key rules the installed PEFT version has.
    """
    from peft import get_peft_model_state_dict

    names = [name for name, _ in model.named_parameters() if "lora_" in name]
    placeholder = {name: torch.tensor(i) for i, name in enumerate(names)}
    peft_keys = get_peft_model_state_dict(model, state_dict=placeholder)
    return {names[int(value)]: key for key, value in peft_keys.items()}


def gather_adapter_state(model: nn.Module, to_cpu: bool = True) -> dict[str, torch.Tensor]:
    """The full LoRA weights as CPU tensors, keyed like `vlrl.models.lora.adapter_state_dict`;
    with `to_cpu=False` they stay on the policy's device (a colocated engine that merges them).

    On a sharded model every worker must call this (one all-gather per LoRA tensor, adapter
    weights only, never the base weights); every worker gets the whole adapter.
    """
    from torch.distributed.tensor import DTensor

    from vlrl.models.lora import adapter_state_dict

    if not is_sharded(model) and to_cpu:
        return adapter_state_dict(model, to_cpu=True)
    # PEFT's key mapping, worked out once per set of LoRA parameter names: its state-dict walk over
    # every tensor of an 8B model is ~40 ms of Python per sync, a walk of named_parameters ~5 ms.
    lora = [(name, param) for name, param in model.named_parameters() if "lora_" in name]
    names = frozenset(name for name, _ in lora)
    cached = getattr(model, "_vlrl_adapter_names", None)
    if cached is None or cached[0] != names:
        cached = (names, _adapter_names(model))
        model._vlrl_adapter_names = cached  # a plain attribute: not a parameter, in no state dict
    keys = cached[1]
    state: dict[str, torch.Tensor] = {}
    for name, param in lora:  # the same order on every worker
        if name in keys:
            full = (param.full_tensor() if isinstance(param, DTensor) else param).detach()
            state[keys[name]] = full.to("cpu", copy=True) if to_cpu else full
    return state


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put full LoRA weights (from `gather_adapter_state` or a checkpoint) into a model, sharded or not."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from vlrl.models.lora import load_adapter_state_dict

    if not is_sharded(model):
        load_adapter_state_dict(model, state)
        return
    keys = _adapter_names(model)
    missing, unexpected = sorted(set(keys.values()) - set(state)), sorted(set(state) - set(keys.values()))
    if missing or unexpected:
        raise VlrlError(
            f"adapter weights do not fit this model: {len(missing)} missing (e.g. {missing[:2]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:2]}); were they made with the same LoRA targets?"
        )
    by_name = {name: state[key] for name, key in keys.items()}
    set_model_state_dict(model, by_name, options=StateDictOptions(full_state_dict=True, strict=False))


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state keyed by parameter name (rank 0 holds it; others get {}).

    Every worker must call this when the model is sharded. The format is the same for one
    worker, so checkpoints move between worker counts.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    if not optimizer.state:
        # Before the first step: torch would initialise the state with a zero-gradient step,
        # which counts as an AdamW step and changes every later update.
        return {"state": {}, "param_groups": []}
    options = StateDictOptions(full_state_dict=True, cpu_offload=is_sharded(model))
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full optimizer state (from `optimizer_state` on any number of workers, or a plain
    `optimizer.state_dict()` of one worker) into this worker's optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not state.get("state"):
        # Saved before the first step: no state (this optimizer may have stepped since, e.g. an
        # update a stability guard drops).
        optimizer.state = collections.defaultdict(dict)
        return
    groups = state.get("param_groups") or [{}]
    if groups[0].get("params") and isinstance(groups[0]["params"][0], int):
        if is_sharded(model):
            raise VlrlError(
                "this checkpoint's optimizer state is keyed by position (an old single-worker format); "
                "resume it with runtime.num_workers=1"
            )
        optimizer.load_state_dict(state)
        return
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))


def dcp_storage(path: str, write: bool):
    """A DCP writer or reader for a local path or an fsspec URL (s3://, gs://, memory://, file://)."""
    import torch.distributed.checkpoint as dcp

    if "://" in path:
        # DCP's fsspec storage lives in a private module (public since torch 2.1 under this name).
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

        return FsspecWriter(path) if write else FsspecReader(path)
    return dcp.FileSystemWriter(path) if write else dcp.FileSystemReader(path)


def _dcp(call, state: dict[str, Any], path: str, model: nn.Module, write: bool) -> None:
    """Run dcp.save/load: across the process group when sharded, else in this process alone."""
    storage = {"storage_writer" if write else "storage_reader": dcp_storage(path, write)}
    if is_sharded(model):
        call(state, **storage)
        return
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process.*")
        call(state, no_dist=True, **storage)


def save_optimizer_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, path: str) -> None:
    """Write optimizer and LR-scheduler state to the directory `path` with DCP.

    Sharded model: every worker must call this at the same time; each writes the shard it holds
    (`__<rank>_0.distcp`) and rank 0 the `.metadata`. Unsharded: this process writes everything.
    Before the first optimizer step only the scheduler is written (torch would otherwise fill the
    empty state with a zero-gradient step, which counts as an AdamW step).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state: dict[str, Any] = {"scheduler": scheduler.state_dict()}
    if optimizer.state:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    _dcp(dcp.save, state, path, model, write=True)


def load_optimizer_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, path: str) -> None:
    """Read what `save_optimizer_checkpoint` wrote, written by any number of workers, into this
    worker's optimizer (its own shard when sharded: every worker must call this) and scheduler."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    saved = dcp_storage(path, write=False).read_metadata().state_dict_metadata
    state: dict[str, Any] = {"scheduler": scheduler.state_dict()}
    has_optimizer = any(key.startswith("optimizer.") for key in saved)
    if has_optimizer:
        # The template DCP fills in place: this optimizer's state (initialised when still empty,
        # every value is then overwritten), sharded like this worker's parameters.
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    _dcp(dcp.load, state, path, model, write=False)
    if has_optimizer:
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"])
    else:
        optimizer.state = collections.defaultdict(dict)  # saved before the first step: a fresh optimizer
    scheduler.load_state_dict(state["scheduler"])


def to_float(value: torch.Tensor | float) -> float:
    """A Python float from a tensor that may be a DTensor (collective on a sharded one)."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        value = value.full_tensor()
    return float(value)
