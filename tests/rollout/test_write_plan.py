"""The write plan of merged-weight syncs: recorded from a real load, it keeps only the tensors a loader
copies plainly into a parameter, and writing through it lands in the loader's places.

The loader here is a small stand-in with the moves vLLM's loaders make (a fused parameter filled slice
by slice from a full-range narrow, `.data` copies, a parameter subclass with its own
`__torch_function__`); the real vLLM loader is exercised in tests/rollout/test_vllm_merged.py.
"""

from __future__ import annotations

import torch

from vlrl.rollout.write_plan import record_loads


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
