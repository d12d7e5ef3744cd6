"""train.compile_blocks: the update runs through compiled block forwards and gets the same gradient."""

from __future__ import annotations

import shutil

import pytest
import torch

from vlrl.envs.base import build_split
from vlrl.errors import VlrlError
from vlrl.models.regional_compile import CompiledBlocks
from vlrl.runtime.update_plan import loss_units, make_update_plans
from vlrl.training.worker import Worker


def _gradient(worker: Worker, seqs, advantages) -> dict[str, torch.Tensor]:
    plan = make_update_plans([loss_units(s) for s in seqs], 0, worker.config.algo)[0]
    worker.model.train()
    worker.policy.optimizer.zero_grad(set_to_none=True)
    with worker.policy.compiled_blocks.active():
        worker.policy.accumulate_gradients(plan.steps[0], seqs, advantages, None, None, plan.denominators[0])
    return {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}


@pytest.mark.skipif(
    shutil.which("g++") is None, reason="torch.compile on CPU needs g++ (scripts/setup-system.sh installs it as root)"
)
def test_compiled_blocks_give_the_same_gradient_and_leave_the_eager_forward_after(ci_config):
    from torch._dynamo.utils import counters

    plain = Worker(ci_config(), 4)
    compiled = Worker(ci_config("train.compile_blocks=true"), 4)
    blocks = compiled.policy.compiled_blocks.blocks
    kinds = {type(b).__name__ for b in blocks}
    assert kinds == {"Qwen3VLTextDecoderLayer", "Qwen3VLVisionBlock"} and len(blocks) > len(kinds)
    episodes = plain.rollout(list(build_split(plain.config.env, "train"))[:2], 2, plain.sampling_params(seed=2))
    seqs = [e.sequence for e in episodes]
    advantages = [1.0, -1.0, 0.5, -0.5]
    counters.clear()
    want, got = _gradient(plain, seqs, advantages), _gradient(compiled, seqs, advantages)
    # The layers of a kind share their graphs: a few per kind (the vision block breaks its graph
    # at the data-dependent cu_seqlens), however many layers there are; the same batch again
    # compiles nothing new.
    graphs = counters["stats"]["unique_graphs"]
    assert 0 < graphs <= 4 * len(kinds), dict(counters["stats"])
    again = _gradient(compiled, seqs, advantages)
    assert counters["stats"]["unique_graphs"] == graphs, dict(counters["stats"])
    assert all("forward" not in vars(b) for b in blocks)  # outside the update: the eager forward again
    assert want.keys() == got.keys() and want
    assert max(float(g.abs().max()) for g in want.values()) > 1e-5
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(again[name], got[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_model_without_blocks_is_one_line():
    with pytest.raises(VlrlError, match="no transformer blocks.*train.compile_blocks=false"):
        CompiledBlocks(torch.nn.Linear(2, 2), enabled=True)


def test_auto_compiles_large_models_on_cuda_only_and_a_wrong_value_is_one_line(ci_config):
    from vlrl.models.regional_compile import AUTO_MIN_PARAMETERS, compile_blocks_enabled

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert ci_config().train.compile_blocks == "auto"  # the default
    assert [compile_blocks_enabled("auto", d) for d in (cpu, cuda)] == [False, True]
    big, small = AUTO_MIN_PARAMETERS, 56_000_000  # the maze9 model: its first step paid a minute of compile
    assert [compile_blocks_enabled("auto", cuda, n) for n in (big, small)] == [True, False]
    assert compile_blocks_enabled(True, cuda, small)  # an explicit true still compiles a small model
    assert [compile_blocks_enabled(v, cpu) for v in (True, False)] == [True, False]
    assert not Worker(ci_config(), 4).policy.compiled_blocks.enabled  # CPU: auto is eager
    with pytest.raises(VlrlError, match="compile_blocks"):
        ci_config("train.compile_blocks=sometimes")


def test_blocks_are_found_through_fsdp2s_renamed_classes():
    """fully_shard swaps a module's class for `FSDP<name>`, a subclass: the block is still a block
    (a 2-worker `vlrl train ... train.compile_blocks=true` refused to start before)."""
    from vlrl.models.regional_compile import transformer_blocks

    class Block(torch.nn.Linear):
        pass

    class Model(torch.nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(2, 2), Block(2, 2)])

    model = Model()
    for layer in model.layers:
        layer.__class__ = type("FSDPBlock", (Block,), {})
    assert transformer_blocks(model) == list(model.layers)
