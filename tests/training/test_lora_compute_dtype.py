"""model.lora.compute_dtype: on a bfloat16 base the LoRA matmuls take bfloat16 inputs (no float32
copy of each projection's input), the adapter's float32 weights stay the master copy, and the
gradient is the float32 path's within bfloat16 rounding."""

from __future__ import annotations

import pytest
import torch

from vlrl.envs.base import build_split
from vlrl.runtime.update_plan import loss_units, make_update_plans
from vlrl.training.worker import Worker


def _lora_a(worker: Worker) -> torch.nn.Module:
    return next(m for n, m in worker.model.named_modules() if n.endswith("q_proj.lora_A.default"))


def _gradient_and_input_dtypes(worker: Worker, seqs, advantages):
    """The gradient of one mini-batch through the policy's update path, and the dtypes a LoRA A
    matrix saw as input in its forward passes (recomputation included)."""
    plan = make_update_plans([loss_units(s) for s in seqs], 0, worker.config.algo)[0]
    seen: list[torch.dtype] = []
    hook = _lora_a(worker).register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    worker.model.train()
    worker.policy.optimizer.zero_grad(set_to_none=True)
    with worker.policy._casting_off():
        worker.policy.accumulate_gradients(plan.steps[0], seqs, advantages, None, None, plan.denominators[0])
    hook.remove()
    grads = {n: p.grad.float().clone() for n, p in worker.model.named_parameters() if p.grad is not None}
    return grads, seen


@pytest.fixture
def batch(ci_config):
    worker = Worker(ci_config("model.dtype=bfloat16"), 4)
    episodes = worker.rollout(list(build_split(worker.config.env, "train"))[:2], 2, worker.sampling_params(seed=2))
    return [e.sequence for e in episodes], [1.0, -1.0, 0.5, -0.5]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_base_compute_dtype_feeds_lora_bf16_and_matches_the_fp32_gradient(ci_config, batch, checkpointing):
    seqs, advantages = batch
    extra = [f"train.gradient_checkpointing={str(checkpointing).lower()}", "model.dtype=bfloat16"]
    upcast = Worker(ci_config("model.lora.compute_dtype=float32", *extra), 4)
    base = Worker(ci_config("model.lora.compute_dtype=base", *extra), 4)
    assert upcast.policy.autocast_dtype is None and base.policy.autocast_dtype == torch.bfloat16
    want, upcast_inputs = _gradient_and_input_dtypes(upcast, seqs, advantages)
    got, base_inputs = _gradient_and_input_dtypes(base, seqs, advantages)
    assert set(upcast_inputs) == {torch.float32}  # PEFT's upcast: a float32 copy of every input
    assert set(base_inputs) == {torch.bfloat16} and len(base_inputs) == len(upcast_inputs) > 0
    assert all(p.dtype == torch.float32 for p in base.policy.params)  # the master weights
    assert want.keys() == got.keys() and want
    # bfloat16 keeps 8 bits of mantissa: the two paths agree to a few bf16 ulps of each tensor's
    # largest entry (the A matrices' gradients are 0 in both: B starts at 0).
    nonzero = [n for n in want if float(want[n].abs().max()) > 0]
    assert any("lora_B" in n for n in nonzero)
    for name in want:
        scale = float(want[name].abs().max())
        assert float((got[name] - want[name]).abs().max()) <= 0.05 * scale, name
    # The switch is put back: a rollout engine sharing the model runs it without autocast.
    assert all(layer.cast_input_dtype_enabled for layer in base.policy._lora_layers)


def test_an_update_on_a_bf16_base_moves_the_fp32_adapter_and_restores_peft_casting(ci_config):
    worker = Worker(ci_config("model.dtype=bfloat16"), 4)
    episodes = worker.rollout(list(build_split(worker.config.env, "train"))[:2], 2, worker.sampling_params(seed=3))
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters() if p.requires_grad}
    stats = worker.policy.update(episodes, [1.0, -1.0, 0.5, -0.5], seed=0)
    assert stats["grad_norm"] > 0
    moved = [n for n, p in worker.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved and all(before[n].dtype == torch.float32 for n in moved)
    assert all(layer.cast_input_dtype_enabled for layer in worker.policy._lora_layers)
    # Outside an update (the rollout engine's forward) PEFT casts as usual and still runs.
    worker.rollout(list(build_split(worker.config.env, "train"))[:1], 2, worker.sampling_params(seed=4))


def test_a_float32_base_runs_without_autocast(ci_config):
    worker = Worker(ci_config("model.lora.compute_dtype=base"), 4)
    assert worker.policy.autocast_dtype is None and worker.policy._lora_layers == []
