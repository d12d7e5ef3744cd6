"""The gradient of a mini-batch does not depend on how it is cut into micro-batches.

One mini-batch of 4 real episodes of the tiny model, accumulated with micro-batch 1 and with
micro-batch 4 (`Policy.accumulate_gradients`, the planner's own cut and normaliser), for every
aggregation x ratio level (token / sequence) x KL on/off, and with rollout correction. Tolerance
(fp32, CPU): rtol 1e-4 / atol 1e-6 per gradient element; the two differ only by the padding of
the batch, i.e. by float rounding.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from vlrl.envs.base import build_split
from vlrl.runtime.update_plan import loss_units, make_update_plans
from vlrl.training.worker import Worker

RTOL, ATOL = 1e-4, 1e-6
AGGREGATIONS = ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]
CASES = [
    (agg, level, kl, "off") for agg, level, kl in itertools.product(AGGREGATIONS, ["token", "sequence"], [0.0, 0.1])
]
CASES += [
    ("token_mean", "token", 0.1, "tis"),
    ("seq_mean_token_mean", "sequence", 0.0, "tis"),
    ("token_mean", "token", 0.0, "masked"),
]


@pytest.fixture(scope="module")
def batch(tmp_path_factory, ci_model_dir):
    """A worker whose adapter moved away from the reference, and 4 episodes with noisy sampler log-probs."""
    from tests.conftest import ROOT
    from vlrl.config import load_config

    cfg = load_config(
        ROOT / "configs" / "ci-tiny.yaml",
        [
            f"model.path={ci_model_dir}",
            f"storage.root={tmp_path_factory.mktemp('runs')}",
            "runtime.backend=local",
            "env.max_turns=3",
        ],
    )
    worker = Worker(cfg, 4)
    tasks = list(build_split(cfg.env, "train"))[:2]
    episodes = worker.rollout(tasks, 2, worker.sampling_params(seed=7))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # policy != reference, so the KL and its gradient are not zero
        for name, p in worker.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    seqs = [e.sequence for e in episodes]
    # Unequal numbers of loss tokens (the tiny model's episodes are often all the same length),
    # so token- and sequence-level normalisations differ and a wrong one shows.
    for i, s in enumerate(seqs[:3]):
        sampled = [t for t, m in enumerate(s.loss_mask) if m]
        for t in sampled[len(sampled) * (i + 1) // 4 :]:
            s.loss_mask[t] = 0
    assert len({loss_units(s) for s in seqs}) == len(seqs)
    old = worker.policy.score_no_grad(seqs)
    # "old" log-probs a little away from the current policy: ratios spread over both clip edges.
    old = [o + 0.3 * torch.randn(o.shape, generator=g) for o in old]
    for s in seqs:  # the sampler a little away from the trainer: rollout-correction weights differ from 1
        s.logprobs = [
            lp + 0.5 * float(torch.randn(1, generator=g)) if m else lp for lp, m in zip(s.logprobs, s.loss_mask)
        ]
    ref = worker.policy.score_no_grad(seqs, with_adapter=False)
    advantages = torch.randn(len(seqs), generator=g).tolist()
    return worker, seqs, old, ref, advantages


def _gradient(worker, seqs, old, ref, advantages, micro: int) -> dict[str, torch.Tensor]:
    policy = policy_of(worker)
    algo = policy.config.algo.model_copy(update={"micro_batch_size": micro, "mini_batch_size": len(seqs)})
    plan = make_update_plans([loss_units(s) for s in seqs], 0, algo)[0]
    assert len(plan.steps) == 1 and len(plan.steps[0]) == -(-len(seqs) // micro)
    policy.optimizer.zero_grad(set_to_none=True)
    stats = policy.accumulate_gradients(plan.steps[0], seqs, advantages, old, ref, plan.denominators[0])
    assert stats["ratio_max"] >= stats["ratio_min"]
    return {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}


def policy_of(worker):
    return worker.policy


@pytest.mark.parametrize("agg,level,kl,correction", CASES, ids=lambda v: str(v))
def test_micro_batch_1_and_full_give_the_same_gradient_rtol_1e4_atol_1e6(batch, agg, level, kl, correction):
    worker, seqs, old, ref, advantages = batch
    a = worker.policy.config.algo
    saved = a.model_dump()
    try:
        for k, v in {
            "loss_agg": agg,
            "ratio_level": level,
            "kl_coef": kl,
            "rollout_correction": correction,
            "rollout_correction_cap": 1.5,
        }.items():
            setattr(a, k, v)
        one = _gradient(worker, seqs, old, ref if kl else None, advantages, 1)
        full = _gradient(worker, seqs, old, ref if kl else None, advantages, len(seqs))
    finally:
        for k in ("loss_agg", "ratio_level", "kl_coef", "rollout_correction", "rollout_correction_cap"):
            setattr(a, k, saved[k])
    assert one.keys() == full.keys() and one
    assert max(float(g.abs().max()) for g in full.values()) > 1e-4  # a real gradient, not zeros
    for name in one:
        torch.testing.assert_close(one[name], full[name], rtol=RTOL, atol=ATOL, msg=name)
