"""train.gradient_checkpointing: the same gradient with less kept activation memory."""

from __future__ import annotations

import torch

from vlrl.envs.base import build_split
from vlrl.runtime.update_plan import loss_units, make_update_plans
from vlrl.training.worker import Worker


def _gradient(worker: Worker, seqs, advantages) -> tuple[dict[str, torch.Tensor], int]:
    """The gradient of one mini-batch, and how often the first decoder layer started a forward."""
    plan = make_update_plans([loss_units(s) for s in seqs], 0, worker.config.algo)[0]
    layer = worker.model.get_base_model().model.language_model.layers[0]
    calls = []
    hook = layer.register_forward_pre_hook(lambda *_: calls.append(1))
    worker.model.train()
    worker.policy.optimizer.zero_grad(set_to_none=True)
    worker.policy.accumulate_gradients(plan.steps[0], seqs, advantages, None, None, plan.denominators[0])
    hook.remove()
    return {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}, len(calls)


def test_checkpointed_blocks_give_the_same_gradient_rtol_1e5_atol_1e7(ci_config):
    plain = Worker(ci_config(), 4)
    checkpointed = Worker(ci_config("train.gradient_checkpointing=true"), 4)
    assert checkpointed.model.get_base_model().is_gradient_checkpointing
    episodes = plain.rollout(list(build_split(plain.config.env, "train"))[:2], 2, plain.sampling_params(seed=2))
    seqs = [e.sequence for e in episodes]
    advantages = [1.0, -1.0, 0.5, -0.5]
    (want, plain_calls), (got, checkpointed_calls) = (
        _gradient(plain, seqs, advantages),
        _gradient(checkpointed, seqs, advantages),
    )
    assert checkpointed_calls == 2 * plain_calls > 0  # every block ran again in backward
    assert want.keys() == got.keys() and want
    assert max(float(g.abs().max()) for g in want.values()) > 1e-5
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7, msg=name)
