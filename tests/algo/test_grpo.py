"""Hand-computed checks of the GRPO-family math. Every expected number is written out."""

from __future__ import annotations

import math

import pytest
import torch

from vlrl.algo.grpo import (
    aggregate_loss,
    combine_advantages,
    discounted_returns,
    entropy_from_logits,
    group_advantages,
    grpo_loss,
    informative_groups,
    kl_k3,
    masked_mean,
    masked_sum,
    policy_loss,
    rare_best_share,
    step_advantages,
    token_advantages,
    token_logprobs,
)
from vlrl.errors import VlrlError


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


# --- advantages --------------------------------------------------------------------------------


def test_discounted_returns_by_hand() -> None:
    assert discounted_returns([0.1, 0.0, 1.0], 0.5) == pytest.approx([0.35, 0.5, 1.0])
    assert discounted_returns([0.1, 0.0, 1.0], 1.0) == pytest.approx([1.1, 1.0, 1.0])
    assert discounted_returns([], 0.9) == []


def test_step_advantages_compare_turns_of_the_same_state_by_hand() -> None:
    # One group of two episodes (gamma 0.5). A: rewards 0.1, 0, 1 in states s0, s1, s2 -> returns
    # 0.35, 0.5, 1.0. B: rewards 0, 0.1 in states s0, s2 -> returns 0.05, 0.1.
    returns = [discounted_returns([0.1, 0.0, 1.0], 0.5), discounted_returns([0.0, 0.1], 0.5)]
    states = [["s0", "s1", "s2"], ["s0", "s2"]]
    # s0: {0.35, 0.05}, mean 0.2, unbiased std 0.3 / sqrt(2) -> +-0.15 / 0.2121 = +-0.7071.
    # s1 is visited once -> 0. s2: {1.0, 0.1} -> +-0.7071. 4 of 5 turns have a same-state partner.
    adv, anchored = step_advantages(returns, states, 2)
    r = 1 / math.sqrt(2)
    assert adv[0] == pytest.approx([r, 0.0, r], abs=1e-5) and adv[1] == pytest.approx([-r, -r], abs=1e-5)
    assert anchored == pytest.approx(0.8)
    plain, _ = step_advantages(returns, states, 2, scale="none")  # Dr. GRPO scaling: R - mean
    assert plain[0] == pytest.approx([0.15, 0.0, 0.45]) and plain[1] == pytest.approx([-0.15, -0.45])
    # States are only compared within a group: two groups of one episode share nothing.
    alone, anchored = step_advantages(returns, states, 1)
    assert alone == [[0.0, 0.0, 0.0], [0.0, 0.0]] and anchored == 0.0
    # The same state twice in ONE episode (a bump leaves the maze picture unchanged) is compared too.
    twice, _ = step_advantages([[0.0, 1.0]], [["s", "s"]], 1, scale="none")
    assert twice == [[pytest.approx(-0.5), pytest.approx(0.5)]]
    with pytest.raises(VlrlError, match="one entry per turn"):
        step_advantages(returns, [["s0"], ["s0", "s2"]], 2)
    with pytest.raises(VlrlError, match="groups of 3"):
        step_advantages(returns, states, 3)


def test_combine_and_token_advantages() -> None:
    per_turn = combine_advantages([1.0, -1.0], [[0.5, 0.0], [-0.5]], 2.0)
    assert per_turn == [[2.0, 1.0], [-2.0]]
    # Turn t's value goes to the tokens of its response span; prompt/environment tokens get 0.
    close(token_advantages([0.5, -1.0], [(2, 4), (6, 7)], 8), [0, 0, 0.5, 0.5, 0, 0, -1.0, 0])
    close(token_advantages(2.0, [(2, 4), (6, 7)], 8), [0, 0, 2.0, 2.0, 0, 0, 2.0, 0])
    with pytest.raises(VlrlError, match="2 per-turn advantages for a sequence of 1 responses"):
        token_advantages([0.5, -1.0], [(2, 4)], 8)
    with pytest.raises(VlrlError, match="one episode advantage"):
        combine_advantages([1.0], [[0.5], [0.1]], 1.0)


def test_group_advantages_std_with_an_all_equal_group() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    # Group 0: mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = 0.5773503; 0.5 / (0.5773503 + 1e-6).
    a = 0.5 / (0.5773502691896258 + 1e-6)  # 0.8660239
    adv = group_advantages(rewards)
    close(adv, [[a, -a, -a, a], [0.0, 0.0, 0.0, 0.0]])
    assert not torch.isnan(adv).any()


def test_group_advantages_unequal_group() -> None:
    # mean 1, deviations [2, 0, -1, -1], unbiased variance 6 / 3 = 2, std 1.4142136
    adv = group_advantages(torch.tensor([[3.0, 1.0, 0.0, 0.0]]))
    close(adv, [[1.4142126, 0.0, -0.7071063, -0.7071063]])


def test_group_advantages_dr_grpo_has_no_std_division() -> None:
    adv = group_advantages(torch.tensor([[3.0, 1.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]]), scale="none")
    close(adv, [[2.0, 0.0, -1.0, -1.0], [0.0, 0.0, 0.0, 0.0]])


def test_group_advantages_flat_input_keeps_its_shape() -> None:
    adv = group_advantages(torch.tensor([1, 0, 0, 1, 1, 1]), group_size=3, scale="none")
    assert adv.shape == (6,)
    close(adv, [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])


def test_float32_equal_rewards_give_exact_zero() -> None:
    # mean of eight float32 0.7s is off by one ulp; without the guard this gives ~0.056.
    adv = group_advantages(torch.full((1, 8), 0.7))
    assert torch.equal(adv, torch.zeros(1, 8))


def test_group_advantages_bad_input() -> None:
    with pytest.raises(VlrlError, match="groups of 4"):
        group_advantages(torch.zeros(6), group_size=4)
    with pytest.raises(VlrlError, match="G >= 2"):
        group_advantages(torch.zeros(3, 1))
    with pytest.raises(VlrlError, match="scale"):
        group_advantages(torch.zeros(2, 2), scale="mad")  # type: ignore[arg-type]


def test_informative_groups() -> None:
    rewards = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.5, 0.5, 0.52]])
    assert informative_groups(rewards).tolist() == [True, False, False, True]
    assert informative_groups(rewards, tol=0.05).tolist() == [True, False, False, False]


# --- masked reductions and aggregation ---------------------------------------------------------


def test_masked_sum_and_mean_ignore_padding_even_if_nan() -> None:
    values = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    close(masked_sum(values, mask), 7.0)
    close(masked_sum(values, mask.bool(), dim=-1), [3.0, 4.0])
    close(masked_mean(values, mask, dim=-1), [1.5, 4.0])
    close(masked_mean(values, torch.zeros(2, 3)), 0.0)


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)  # third is empty


@pytest.mark.parametrize(
    ("mode", "max_tokens", "expected"),
    [
        ("token_mean", None, (1 + 2 + 3 + 4) / 4),  # 2.5
        ("seq_mean_token_mean", None, (6 / 3 + 4 / 1) / 2),  # 3.0
        ("seq_mean_token_sum", None, (6 + 4) / 2),  # 5.0
        ("seq_mean_token_sum", 4, (6 / 4 + 4 / 4) / 2),  # 1.25
    ],
)
def test_aggregate_loss_modes(mode: str, max_tokens: int | None, expected: float) -> None:
    close(aggregate_loss(LOSS, MASK, mode, max_tokens), expected)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_aggregate_loss_all_empty_is_zero_not_nan(mode: str) -> None:
    close(aggregate_loss(LOSS, torch.zeros(3, 3), mode), 0.0)  # type: ignore[arg-type]


def test_aggregate_loss_rejects_unknown_mode() -> None:
    with pytest.raises(VlrlError, match="aggregation"):
        aggregate_loss(LOSS, MASK, "sum")  # type: ignore[arg-type]


# --- policy loss -------------------------------------------------------------------------------


def one_token_loss(ratio: float, advantage: float, **kwargs) -> tuple[float, float, dict]:
    """Loss and d loss / d logp for a single token with the given ratio."""
    logprobs = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    loss, stats = policy_loss(logprobs, old, torch.tensor([advantage]), torch.ones(1, 1), **kwargs)
    loss.backward()
    return loss.item(), logprobs.grad.item(), stats


def test_ratio_above_clip_with_positive_advantage_is_clipped() -> None:
    loss, grad, stats = one_token_loss(1.5, 1.0)
    assert loss == pytest.approx(-1.2)  # -min(1.5 * 1, 1.2 * 1)
    assert grad == 0.0
    assert stats["clip_fraction"].item() == 1.0
    assert stats["clip_high_fraction"].item() == 1.0


def test_ratio_below_clip_with_negative_advantage_is_clipped() -> None:
    loss, grad, stats = one_token_loss(0.5, -1.0)
    assert loss == pytest.approx(0.8)  # -min(0.5 * -1, 0.8 * -1)
    assert grad == 0.0
    assert stats["clip_low_fraction"].item() == 1.0


def test_ratio_outside_clip_on_the_other_side_keeps_its_gradient() -> None:
    # ratio 1.5, A = -1: -min(-1.5, -1.2) = 1.5, d/dlogp = -A * ratio = 1.5, not clipped.
    loss, grad, stats = one_token_loss(1.5, -1.0)
    assert (loss, grad) == (pytest.approx(1.5), pytest.approx(1.5))
    assert stats["clip_fraction"].item() == 0.0
    # ratio 0.5, A = +1: -min(0.5, 0.8) = -0.5, d/dlogp = -0.5.
    loss, grad, _ = one_token_loss(0.5, 1.0)
    assert (loss, grad) == (pytest.approx(-0.5), pytest.approx(-0.5))


def test_asymmetric_clip_range() -> None:
    assert one_token_loss(1.25, 1.0)[0] == pytest.approx(-1.2)  # eps_high 0.2 clips
    assert one_token_loss(1.25, 1.0, eps_high=0.28)[0] == pytest.approx(-1.25)  # DAPO: no clip
    assert one_token_loss(0.75, -1.0)[0] == pytest.approx(0.8)  # eps_low 0.2 clips at 0.8
    assert one_token_loss(0.75, -1.0, eps_low=0.3)[0] == pytest.approx(0.75)


def test_gspo_sequence_ratio() -> None:
    # seq 0: log-ratios [0.1, 0.3] -> s = exp(0.2) = 1.2214028 > 1.2, A = 1 -> loss -1.2, no grad
    # seq 1: log-ratio [-0.1] (+ one padding token) -> s = exp(-0.1) = 0.9048374, A = 2
    #        -> loss -2 * 0.9048374 = -1.8096748; d/dlogp = -A * s / n_1 / B = -0.9048374
    logprobs = torch.tensor([[0.1, 0.3], [-0.1, 5.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, stats = policy_loss(logprobs, old, torch.tensor([1.0, 2.0]), mask, ratio_level="sequence")
    loss.backward()
    close(loss, (-1.2 - 2 * 0.9048374180359595) / 2)
    close(logprobs.grad, [[0.0, 0.0], [-0.9048374180359595, 0.0]])
    close(stats["clip_fraction"], 0.5)  # one of two sequences
    close(stats["ratio_max"], 1.2214027581601699)
    close(stats["ratio_min"], 0.9048374180359595)


def test_policy_loss_shape_errors() -> None:
    with pytest.raises(VlrlError, match="one value per sequence"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(VlrlError, match="ratio_level 'token'"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), ratio_level="sequence")
    with pytest.raises(VlrlError, match="same shape"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3))


def test_per_token_advantages_equal_to_per_sequence_ones_give_the_same_loss() -> None:
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -0.7, -0.1]], requires_grad=True)
    old = torch.tensor([[-1.1, -0.2, -2.0], [-0.3, -1.5, -0.4]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    per_seq, _ = policy_loss(logp, old, torch.tensor([0.5, -2.0]), mask, eps_high=0.28)
    per_tok, _ = policy_loss(logp, old, torch.tensor([[0.5] * 3, [-2.0] * 3]), mask, eps_high=0.28)
    close(per_tok.detach(), float(per_seq.detach()))
    # Different values per token weigh each token's own term: only token (0, 1) gets A = 3.
    one, _ = policy_loss(logp, old, torch.tensor([[0.0, 3.0, 0.0], [0.0, 0.0, 0.0]]), mask)
    ratio = math.exp(-0.5 - -0.2)  # 0.741, below 1 - eps_low; with A > 0 min() keeps the unclipped term
    close(one.detach(), -ratio * 3.0 / 5)  # token_mean over the 5 masked tokens


# --- KL and the full objective -----------------------------------------------------------------


def test_kl_k3() -> None:
    x = torch.tensor([-1.0, -0.3, -2.5])
    assert torch.equal(kl_k3(x, x), torch.zeros(3))
    # d = ref - logp = -1: exp(-1) + 1 - 1 = 0.3678794; d = 0.5: exp(0.5) - 1.5 = 0.1487213
    close(kl_k3(torch.tensor([-1.0, -1.0]), torch.tensor([-2.0, -0.5])), [0.3678794, 0.1487213])
    assert (kl_k3(torch.randn(100), torch.randn(100)) >= 0).all()


def test_grpo_loss_value_and_gradient_by_hand() -> None:
    # Three real tokens (N = 3) and one padding token full of inf/NaN that must not leak.
    # seq 0, A = 1:    ratios [1, exp(0.5) = 1.65 (clipped, no grad)]
    # seq 1, A = -0.5: ratio exp(-0.2) = 0.8187308 (inside [0.8, 1.2])
    # token_mean: d loss/d logp_t = ( -A * ratio_t [if unclipped] + kl_coef * (1 - exp(ref - logp)) ) / 3
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0, -2.5], [-0.3, float("-inf")]], dtype=torch.float64)
    ref = torch.tensor([[-1.2, -2.0], [-0.4, float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    loss, stats = grpo_loss(
        logprobs,
        old,
        ref,
        torch.tensor([1.0, -0.5], dtype=torch.float64),
        mask,
        eps_low=0.2,
        eps_high=0.2,
        ratio_level="token",
        agg="token_mean",
        kl_coef=0.1,
    )
    loss.backward()
    pg = (-1.0 - 1.2 + 0.5 * 0.8187307530779818) / 3  # -0.5968782
    kl = ((0.8187307530779818 + 0.2 - 1) + 0.0 + (1.1051709180756477 - 0.1 - 1)) / 3
    close(loss, pg + 0.1 * kl)
    close(stats["pg_loss"], pg)
    close(stats["kl"], kl)
    close(stats["clip_fraction"], 1 / 3)
    close(
        logprobs.grad,
        [
            [-1 / 3 + 0.0060423082307339395, 0.0],
            [0.13645512551299696 - 0.003505697269188257, 0.0],
        ],
    )


def test_grpo_loss_without_reference() -> None:
    lp = torch.tensor([[-1.0, -1.0]])
    loss, stats = grpo_loss(lp, lp, None, torch.tensor([2.0]), torch.ones(1, 2))
    close(loss, -2.0)  # ratio 1 everywhere: -A
    assert "kl" not in stats
    with pytest.raises(VlrlError, match="reference"):
        grpo_loss(lp, lp, None, torch.tensor([2.0]), torch.ones(1, 2), kl_coef=0.1)


# --- from logits -------------------------------------------------------------------------------


def test_entropy_of_uniform_and_two_point_distributions() -> None:
    close(entropy_from_logits(torch.full((2, 3, 7), 4.2)), [[math.log(7)] * 3] * 2)
    # logits [0, ln 3] -> p = [0.25, 0.75] -> H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351
    close(entropy_from_logits(torch.tensor([[[0.0, math.log(3)]]])), [[0.5623351446188083]])
    # a banned (-inf) token contributes nothing: uniform over the other two
    close(entropy_from_logits(torch.tensor([[[1.0, 1.0, float("-inf")]]])), [[math.log(2)]])


def test_token_logprobs_matches_log_softmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    tokens = torch.randint(0, 11, (3, 5))
    expected = torch.log_softmax(logits, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, tokens), expected)
    out = token_logprobs(logits.bfloat16(), tokens)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, atol=0.05, rtol=0)


def test_token_logprobs_temperature_and_gradient() -> None:
    # logits [0, ln 4] at temperature 2 -> [0, ln 2] -> p = [1/3, 2/3]
    logits = torch.tensor([[[0.0, math.log(4)], [0.0, math.log(4)]]], requires_grad=True)
    out = token_logprobs(logits, torch.tensor([[1, 0]]), temperature=2.0)
    close(out, [[math.log(2 / 3), math.log(1 / 3)]])
    out.sum().backward()
    # d log p_1 / d z = (onehot - p) / tau: token 1 -> [-1/6, 1/6]; token 0 -> [1/3, -1/3]
    close(logits.grad, [[[-1 / 6, 1 / 6], [1 / 3, -1 / 3]]])
    with pytest.raises(VlrlError, match="temperature"):
        token_logprobs(logits, torch.tensor([[1, 0]]), temperature=0.0)


def test_rare_best_share() -> None:
    # Group 0: one win in four (rare best); 1: three wins in four; 2: no signal; 3: the best (0.9) once in three.
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.9, 0.1, 0.1, 0.1]])
    assert rare_best_share(rewards) == pytest.approx(2 / 3)
    assert rare_best_share(torch.tensor([[1.0, 1.0, 0.0, 0.0]])) == 0.0  # half is not fewer than half
    assert rare_best_share(torch.ones(2, 4)) is None  # no group with signal: nothing to say
