"""The write plan of merged-weight syncs: recorded from a real load, it keeps only the tensors a loader
copies plainly into a parameter, and writing through it lands in the loader's places.

The loader here is a small stand-in with the moves vLLM's loaders make (a fused parameter filled slice
by slice from a full-range narrow, `.data` copies, a parameter subclass with its own
`__torch_function__`); the real vLLM loader is exercised in tests/rollout/test_vllm_merged.py.
"""

from __future__ import annotations

import torch

from vlrl.models.vision_merge import merge_lora
from vlrl.rollout.write_plan import MergeProgram, record_loads


class _OwnParameter(torch.nn.Parameter):
    """A parameter class with its own torch-function handling, as vLLM's `BasevLLMParameter`."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Parameter(torch.zeros(6, 4), requires_grad=False)
        self.o = _OwnParameter(torch.zeros(4, 4), requires_grad=False)
        self.t = torch.nn.Parameter(torch.zeros(4, 4), requires_grad=False)
        self.n = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
        self.s = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
        self.h = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64), requires_grad=False)
        self.scratch = torch.zeros(4)


def _loader(model: _Model):
    def load(weights):
        loaded = []
        for name, w in weights:
            if name in ("q", "k", "v"):  # one fused parameter, a slice per checkpoint tensor
                dst = model.qkv.data.narrow(0, 2 * "qkv".index(name), 2)
                w = w.narrow(0, 0, w.shape[0])  # a one-way tensor parallel's full-range shard
                assert dst.shape == w.shape
                dst.copy_(w)
            elif name == "o":
                model.o.data.copy_(w.data)
            elif name == "t":  # a layout change: not a plain copy
                model.t.data.copy_(w.t())
            elif name == "n":  # through a scratch buffer: the buffer is no parameter
                model.scratch.copy_(w)
                model.n.data.copy_(model.scratch)
            elif name == "s":  # changed in place before its copy
                w.mul_(2)
                model.s.data.copy_(w)
            elif name == "h":  # a dtype conversion on the way
                model.h.data.copy_(w)
            loaded.append(name)
        return loaded

    return load


def test_the_plan_keeps_plain_copies_and_sends_everything_else_back_to_the_loader():
    model = _Model()
    g = torch.Generator().manual_seed(0)
    weights = [(n, torch.randn(2, 4, generator=g)) for n in "qkv"]
    weights += [(n, torch.randn(4, 4, generator=g)) for n in "ot"]
    weights += [(n, torch.randn(4, generator=g)) for n in ("n", "s", "h", "skipped")]
    expected = {name: w.clone() for name, w in weights}
    loaded, plan = record_loads(model, _loader(model), iter(weights))

    assert loaded == [name for name, _ in weights]  # the real load ran, in order
    assert torch.equal(model.qkv, torch.cat([expected[n] for n in "qkv"]))  # and put every tensor in
    assert torch.equal(model.t, expected["t"].t())
    assert set(plan.targets) == {"q", "k", "v", "o"}
    assert plan.loader_only == {"t", "n", "s", "h", "skipped"}
    for name in "qkvo":
        (target,) = plan.targets[name]
        assert type(target) is torch.Tensor and torch.equal(target, expected[name])

    # Writing through the plan lands where the loader put the tensor: the fused slice, the subclass.
    plan.targets["k"][0].fill_(7.0)
    plan.targets["o"][0].copy_(torch.ones(4, 4))
    assert torch.equal(model.qkv[2:4], torch.full((2, 4), 7.0))
    assert torch.equal(model.qkv[:2], expected["q"]) and torch.equal(model.qkv[4:], expected["v"])
    assert torch.equal(model.o, torch.ones(4, 4))


def test_a_plan_of_nothing_plainly_copied_is_empty():
    model = _Model()
    _, plan = record_loads(model, _loader(model), iter([("t", torch.randn(4, 4))]))
    assert len(plan) == 0 and plan.loader_only == {"t"}


def _program_setup(factor_dtype):
    """A plan recorded from the stand-in loader, LoRA on q and o (o copied into two views: a weight
    some loaders copy twice), the base W0 and the views bound into a `MergeProgram`."""
    model = _Model()
    g = torch.Generator().manual_seed(1)
    base = {n: torch.randn(2, 4, generator=g) for n in "qkv"} | {"o": torch.randn(4, 4, generator=g)}
    _, plan = record_loads(model, _loader(model), iter((n, w.clone()) for n, w in base.items()))
    second_o = torch.zeros(4, 4)
    plan.targets["o"].append(second_o)
    program = MergeProgram(
        [(n, base[n], plan.targets[n]) for n in ("q", "o")],
        [(base[n], plan.targets[n]) for n in ("k", "v")],
        scale=0.5,
        factor_dtype=factor_dtype,
    )
    return model, base, plan, second_o, program


def _pairs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return {
        "q": (torch.randn(3, 4, generator=g), torch.randn(2, 3, generator=g)),
        "o": (torch.randn(3, 4, generator=g), torch.randn(4, 3, generator=g)),
    }


def test_a_merge_program_writes_what_the_per_tensor_merge_writes_bit_for_bit():
    for factor_dtype in (torch.float32, torch.bfloat16):
        model, base, plan, second_o, program = _program_setup(factor_dtype)
        assert program.names == ["q", "o"] and len(program) == 4
        model.qkv.data.zero_()  # what a level-2 sleep leaves: nothing
        pairs = _pairs(2)
        program.load(pairs)
        program.run()
        want = {n: merge_lora(base[n], *pairs[n], 0.5, n, torch.float32, factor_dtype) for n in ("q", "o")}
        assert torch.equal(model.qkv[:2], want["q"]) and torch.equal(model.o, want["o"])
        assert torch.equal(second_o, want["o"])
        assert torch.equal(model.qkv[2:4], base["k"]) and torch.equal(model.qkv[4:], base["v"])  # the copies


def test_a_merge_program_keeps_the_version_it_loaded_and_always_merges_from_w0():
    """A run without a load (a wake's rewrite) writes the last loaded version again, even after the
    caller's tensors changed; every run starts from W0, so A, B, A gives A's weights exactly."""
    model, base, _, _, program = _program_setup(torch.bfloat16)
    first = _pairs(3)
    program.load(first)
    program.run()
    served = model.o.detach().clone()
    for a, b in first.values():
        a.add_(1.0), b.mul_(3.0)  # the policy's live tensors move on after the sync
    model.o.data.zero_()
    program.run()
    assert torch.equal(model.o, served)
    program.load(_pairs(4))
    program.run()
    assert not torch.equal(model.o, served)
    program.load(_pairs(3))
    program.run()
    assert torch.equal(model.o, served)
