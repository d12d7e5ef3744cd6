"""Where a weight loader puts each tensor, so that the next merge can write there itself.

A merged-weight sync (`rollout.lora_mode=merged`) hands vLLM every merged weight through the model's
own `load_weights`, which maps checkpoint names to its parameters (q, k and v into one `qkv_proj`,
the HF-to-vLLM prefixes) and copies each tensor in. At 8B that costs, every sync, Python time for
some 400 tensors and a second pass over every weight: the merge writes a fresh tensor, the loader
copies it. A `WritePlan` is recorded during one real load instead (`record_loads`): each tensor
goes in wrapped in a subclass that watches what the loader does with it. A tensor the loader only
copies, whole and in its own dtype, into a view of a model parameter (the parameter, or a slice of
a fused one) gets that view in the plan, and the next merge computes W0 + s * B @ A straight into
it (`vision_merge.merge_lora(out=...)`). A tensor the loader converts, reshapes, or uses in any
other way, or copies into something that is not a parameter, is left out of the plan and keeps
going through the loader. Nothing here knows vLLM: it sees only tensors and a loader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class WritePlan:
    """Checkpoint name -> the parameter views its tensor was copied into, for the names the
    loader copied plainly; `loader_only`: the names that must keep going through the loader."""

    targets: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    loader_only: set[str] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.targets)


class _Recorder:
    def __init__(self, storages: set[int]):
        self.storages = storages  # data pointers of the parameters' storages
        self.targets: dict[str, list[torch.Tensor]] = {}
        self.seen: set[str] = set()
        self.tainted: set[str] = set()

    def plan(self) -> WritePlan:
        targets = {n: t for n, t in self.targets.items() if n not in self.tainted}
        return WritePlan(targets, (self.seen - set(targets)) | self.tainted)


class _Watched(torch.Tensor):
    """A tensor handed to a loader, tagged with its checkpoint name and the recorder watching it."""

    _vlrl_tag: tuple[str, _Recorder]  # set by `_watch`, the only way one is made

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        watched = [a for a in _flat(args, kwargs) if isinstance(a, _Watched)]
        # Every subclass's own handling off (vLLM's parameters have one too): plain tensors here.
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **kwargs)
            if func is torch.Tensor.copy_ and len(args) == 2 and not kwargs and isinstance(args[1], _Watched):
                dst, src = args
                name, recorder = src._vlrl_tag
                if not isinstance(dst, _Watched):
                    if _plain_copy(dst, src, recorder.storages):
                        recorder.targets.setdefault(name, []).append(dst.detach())
                    else:
                        recorder.tainted.add(name)
                return result
        if _in_place(func):  # a tensor changed before (or instead of) its copy
            for w in watched:
                name, recorder = w._vlrl_tag
                recorder.tainted.add(name)
            return result
        if not isinstance(result, torch.Tensor):
            return result  # a question about the tensor (its shape, dtype, ...), not a use of it
        if isinstance(result, _Watched) and any(result is w for w in watched):
            return result  # the tensor itself (e.g. `.to()` of its own dtype)
        for w in watched:
            name, recorder = w._vlrl_tag
            if _same_view(result, w):
                # The same memory and layout under another tensor object (`.data`, a full-range
                # narrow for a one-way tensor parallel): still the tensor the loader was given.
                return _watch(result, name, recorder)
            recorder.tainted.add(name)
        return result


def _in_place(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def _flat(args: Any, kwargs: dict) -> Iterator[Any]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.device == b.device
    )


def _plain_copy(dst: torch.Tensor, src: torch.Tensor, storages: set[int]) -> bool:
    """A copy the plan can replay by writing into `dst`: same shape and dtype (no conversion on the
    way), and `dst` lives in a parameter's storage (not a scratch buffer the loader copies on)."""
    return (
        tuple(dst.shape) == tuple(src.shape)
        and dst.dtype == src.dtype
        and dst.device == src.device
        and dst.untyped_storage().data_ptr() in storages
    )


def _watch(tensor: torch.Tensor, name: str, recorder: _Recorder) -> _Watched:
    watched = tensor.as_subclass(_Watched)
    watched._vlrl_tag = (name, recorder)
    return watched


def record_loads(
    model: torch.nn.Module, load: Callable[[Iterable[tuple[str, torch.Tensor]]], Any], weights: Iterable
) -> tuple[Any, WritePlan]:
    """Run `load(weights)` (a real load: every tensor goes in as usual) and return what it returned
    and the `WritePlan` seen on the way. `model`'s parameters are the only valid destinations."""
    with torch._C.DisableTorchFunctionSubclass():
        recorder = _Recorder({p.untyped_storage().data_ptr() for p in model.parameters()})

    def watched() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            recorder.seen.add(name)
            yield name, _watch(tensor, name, recorder)

    result = load(watched())
    return result, recorder.plan()


class MergeProgram:
    """A write plan bound to its tensors, replayed by every sync after the one that recorded it.

    The loop a sync would otherwise run in Python once per checkpoint tensor (some 800 at 8B shape:
    the name lookups, the checks, a cast of A and of B, the merge, each its own call) was most of a
    merge's time: the GPU waited for the host. Here the tensors are gathered once. A sync then copies
    the new A and B into the program's buffers in one call (`torch._foreach_copy_`, cast to the
    factor dtype on the way), merges each LoRA weight into its view (`vision_merge.merge_lora`: one
    `addmm` on a GPU with a 16-bit base), and copies the tensors without LoRA (those a level-2 sleep
    dropped) in one more call. The arithmetic is the per-tensor loop's, so the weights are the same
    bit for bit.

    Only for bases that stay where they are between syncs (the policy's own frozen weights on one
    worker, or the engine's pristine copy): the program holds them.
    """

    def __init__(
        self,
        merges: list[tuple[str, torch.Tensor, list[torch.Tensor]]],
        copies: list[tuple[torch.Tensor, list[torch.Tensor]]],
        scale: float,
        factor_dtype: torch.dtype,
    ):
        self.names = [name for name, _, _ in merges]  # the LoRA weights, in merge order
        self._merges = merges  # (checkpoint name, W0, the plan's views)
        self._scale, self._factor_dtype = scale, factor_dtype
        self._a: list[torch.Tensor] = []  # A and B as last loaded, in the factor dtype
        self._b: list[torch.Tensor] = []
        # The tensors without LoRA: one source and one destination list (a fused view gets its own entry).
        self._copy_src = [base for base, views in copies for _ in views]
        self._copy_dst = [view for _, views in copies for view in views]

    def __len__(self) -> int:
        return len(self._merges) + len(self._copy_dst)

    def load(self, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy this version's A and B (`vision_merge.lora_pairs`) into the program's buffers."""
        if not self.names:
            return
        a = [pairs[name][0] for name in self.names]
        b = [pairs[name][1] for name in self.names]
        if not self._a:
            device = self._merges[0][1].device if self._merges else None
            self._a = [torch.empty(t.shape, dtype=self._factor_dtype, device=device) for t in a]
            self._b = [torch.empty(t.shape, dtype=self._factor_dtype, device=device) for t in b]
        with torch.no_grad():
            torch._foreach_copy_(self._a + self._b, a + b)

    def run(self) -> None:
        """Write W0 + scale * B @ A (from the loaded A and B) and every LoRA-free tensor into the
        served weights."""
        from vlrl.models.vision_merge import merge_lora

        if self._merges and not self._a:
            raise RuntimeError("MergeProgram.run before any load")
        with torch.no_grad():
            for (name, base, views), a, b in zip(self._merges, self._a, self._b):
                first = merge_lora(base, a, b, self._scale, name, views[0].dtype, self._factor_dtype, out=views[0])
                for other in views[1:]:
                    other.copy_(first)
            if self._copy_dst:
                torch._foreach_copy_(self._copy_dst, self._copy_src)
