"""torch.compile of each transformer block for the policy's update (`train.compile_blocks`).

Regional compilation, as the PyTorch recipe "Reducing torch.compile cold start compilation time
with regional compilation" does it: only the blocks (`_no_split_modules`, e.g. Qwen3-VL's text
decoder layer and vision block) are compiled, not the whole model. All blocks of a kind share one
`forward` code object, so Dynamo compiles it once and every layer reuses the graph (parameters are
graph inputs). What it buys is the fusion of the elementwise work around the matmuls (RMSNorm in
fp32, SwiGLU, rotary embeddings, LoRA's scale and add), which eager PyTorch runs as separate
kernels: in the 8B-shape update they take more device time than the attention.

The compiled forward is put on each block as an instance attribute for the duration of a
`CompiledBlocks.active()` context only (the update), so rollouts of the transformers engine, which
shares the module, and evaluation keep the eager forward. FSDP2's hooks run in `Module.__call__`,
outside the compiled forward. A graph Dynamo cannot compile falls back to eager for that frame (a
warning, not an error); a new shape or adapter state is a recompile, bounded by Dynamo's limit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from vlrl.errors import VlrlError


def transformer_blocks(model: Any) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class is named in `_no_split_modules` (the list
    transformers keeps for device maps and FSDP wrapping); a PEFT wrapper is looked through, and so
    is FSDP2's, which swaps each sharded module's class for a subclass named `FSDP<name>`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in base.modules() if any(c.__name__ in names for c in type(m).__mro__)]


# `auto` compiles only models at least this large. The 8B shape's update is 30% faster compiled for
# ~10 s of compile once; the 56M maze9 model's first GRPO step (log-probs + optimizer) took 63 s
# compiled where an eager run of the same script took 5 s, in arms of 1.5 minutes: its updates are
# too short for the fusion to win back the compile and the recompile for dynamic sequence lengths.
AUTO_MIN_PARAMETERS = 1_000_000_000


def compile_blocks_enabled(setting: bool | str, device: torch.device, parameters: int | None = None) -> bool:
    """`train.compile_blocks` resolved for the policy: `auto` compiles on CUDA, for models of at least
    `AUTO_MIN_PARAMETERS` parameters (all of them, frozen or not; None: size unknown, compile)."""
    if setting == "auto":
        return device.type == "cuda" and (parameters is None or parameters >= AUTO_MIN_PARAMETERS)
    return bool(setting)


class CompiledBlocks:
    """The compiled forwards of a model's blocks, made at the first `active()` and kept."""

    def __init__(self, model: Any, enabled: bool):
        self.enabled = enabled
        self.blocks = transformer_blocks(model) if enabled else []
        if enabled and not self.blocks:
            raise VlrlError(
                f"{type(model).__name__} declares no transformer blocks (_no_split_modules) to compile; "
                "set train.compile_blocks=false"
            )
        self._forwards: list[Any] | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self._forwards is None:
            # dynamic=None: the first shape is compiled static, a second one marks the changing
            # dims dynamic (sequence lengths differ from micro-batch to micro-batch).
            self._forwards = [torch.compile(block.forward) for block in self.blocks]
        for block, forward in zip(self.blocks, self._forwards):
            block.forward = forward  # an instance attribute shadows the class's forward
        try:
            yield
        finally:
            for block in self.blocks:
                del block.forward
