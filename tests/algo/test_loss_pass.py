"""The chunked loss pass, rollout correction and the sampler/trainer gap (algo.grpo)."""

from __future__ import annotations

import pytest
import torch

from vlrl.algo.grpo import (
    entropy_from_logits,
    head_logprobs,
    kl_aggregation,
    rollout_correction_weights,
    sampler_mismatch,
    token_logprobs,
)
from vlrl.errors import VlrlError


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_head_logprobs_equal_token_logprobs_and_their_gradient(chunk):
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(7, 8, generator=g, requires_grad=True)
    tokens = torch.randint(0, 9, (7,), generator=g)
    suppress, temperature = [9, 10], 0.7

    full_logits = head(hidden)
    want = token_logprobs(full_logits[None], tokens[None], temperature, suppress)[0]
    want_ent = entropy_from_logits(
        (full_logits.float() / temperature).index_fill(-1, torch.tensor(suppress), float("-inf"))[None]
    )[0]
    want.sum().backward()
    want_grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    got, ent = head_logprobs(hidden, head, tokens, temperature, suppress, chunk_rows=chunk, with_entropy=True)
    assert not ent.requires_grad
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, want_ent.detach(), rtol=0, atol=1e-6)
    got.sum().backward()
    torch.testing.assert_close(hidden.grad, want_grads[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(head.weight.grad, want_grads[1], rtol=1e-5, atol=1e-7)


def test_head_logprobs_refuses_bad_shapes_and_chunks():
    head = torch.nn.Linear(4, 5)
    with pytest.raises(VlrlError, match=r"\[N, H\]"):
        head_logprobs(torch.zeros(2, 3, 4), head, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(VlrlError, match="chunk_rows"):
        head_logprobs(torch.zeros(2, 4), head, torch.zeros(2, dtype=torch.long), chunk_rows=0)


def test_rollout_correction_truncates_or_masks_the_trainer_over_sampler_ratio():
    trainer = torch.tensor([[0.0, -1.0, -3.0, 0.0]])
    sampler = torch.tensor([[0.0, -2.0, -1.0, 5.0]])  # ratios 1, e, e^-2; the last token is padding
    mask = torch.tensor([[1, 1, 1, 0]])
    tis = rollout_correction_weights(trainer, sampler, mask, "tis", 2.0)
    torch.testing.assert_close(tis, torch.tensor([[1.0, 2.0, float(torch.tensor(-2.0).exp()), 1.0]]))
    masked = rollout_correction_weights(trainer, sampler, mask, "masked", 2.0)
    assert masked.tolist() == [[1.0, 0.0, 1.0, 1.0]]
    seq = rollout_correction_weights(trainer, sampler, mask, "tis", 10.0, ratio_level="sequence")
    torch.testing.assert_close(seq, torch.tensor([(-1.0 / 3).__float__()]).exp())  # exp(mean of 0, 1, -2)
    with pytest.raises(VlrlError, match="cap"):
        rollout_correction_weights(trainer, sampler, mask, "tis", 0.0)


def test_sampler_mismatch_sums_only_the_masked_tokens():
    trainer = torch.tensor([[-1.0, -2.0, 9.0]])
    sampler = torch.tensor([[-1.5, -1.0, 0.0]])
    gap = sampler_mismatch(trainer, sampler, torch.tensor([[1, 1, 0]]))
    assert float(gap["tokens"]) == 2 and float(gap["abs_sum"]) == pytest.approx(1.5) and float(gap["abs_max"]) == 1.0
    d = torch.tensor([0.5, -1.0])
    assert float(gap["k3_sum"]) == pytest.approx(float((d.exp() - d - 1).sum()))


def test_gspo_kl_is_aggregated_per_sequence():
    assert kl_aggregation("token_mean", "sequence") == "seq_mean_token_mean"
    assert kl_aggregation("seq_mean_token_sum", "sequence") == "seq_mean_token_sum"
    assert kl_aggregation("token_mean", "token") == "token_mean"
