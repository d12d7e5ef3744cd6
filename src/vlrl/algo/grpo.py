"""The pure math of the GRPO family: advantages, clipped policy losses, KL, and log-probs.

Everything here is a small function on tensors, with the formula in its docstring. Shapes:
B sequences, T completion tokens per sequence, V vocabulary entries, G samples per prompt.
`mask[B, T]` (bool or 0/1 float) marks the real completion tokens; padding is ignored everywhere.

Papers:
- PPO clipped surrogate: Schulman et al. 2017, arXiv:1707.06347.
- GRPO: Shao et al. 2024 (DeepSeekMath), arXiv:2402.03300.
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783.
- DAPO: Yu et al. 2025, arXiv:2503.14476 (clip-higher, dynamic sampling, token-level loss).
- GSPO: Zheng et al. 2025, arXiv:2507.18071 (sequence-level importance ratio).
- k3 KL estimator: Schulman 2020, "Approximating KL Divergence" (blog post).
- GiGPO: Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
  arXiv:2505.10978 (step-level advantages from anchor states, for multi-turn episodes).
"""

from __future__ import annotations

from collections.abc import Sequence

from typing import Literal

import torch

from vlrl.errors import VlrlError

AdvantageScale = Literal["std", "none"]
Aggregation = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]
RatioLevel = Literal["token", "sequence"]


# --- Advantages --------------------------------------------------------------------------------


def group_advantages(
    rewards: torch.Tensor,
    group_size: int | None = None,
    *,
    scale: AdvantageScale = "std",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages, one per sample, shaped like `rewards`.

    `rewards` is [num_groups, G], or 1-D with consecutive runs of `group_size` samples per group.
    scale="std" (GRPO, Shao et al. 2024):  A_i = (r_i - mean(r)) / (std(r) + eps)
    scale="none" (Dr. GRPO, Liu et al. 2025): A_i = r_i - mean(r)
    std is the unbiased (Bessel, divide by G-1) `torch.std`, as in TRL and verl. A group whose
    rewards are all equal gets exactly 0: in float32 its mean can be off by one ulp, and that
    ulp divided by a near-zero std would otherwise give advantages of order 0.05.
    """
    if scale not in ("std", "none"):
        raise VlrlError(f"advantage scale must be 'std' or 'none', got {scale!r}")
    grouped = _as_groups(rewards, group_size)
    if grouped.shape[1] < 2:
        raise VlrlError("group-relative advantages need at least 2 samples per group (G >= 2)")
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "std":
        centered = centered / (grouped.std(dim=1, keepdim=True) + eps)
    constant = ~informative_groups(grouped)
    return centered.masked_fill(constant[:, None], 0.0).reshape(rewards.shape)


def informative_groups(rewards: torch.Tensor, tol: float = 0.0) -> torch.Tensor:
    """Bool[num_groups]: True where a group's rewards are not all equal (max - min > tol).

    Groups with identical rewards have zero advantage and no gradient; DAPO's dynamic sampling
    (Yu et al. 2025) drops them and samples more prompts instead.
    """
    grouped = _as_groups(rewards, None)
    spread = grouped.max(dim=1).values - grouped.min(dim=1).values
    return spread > tol


def _as_groups(rewards: torch.Tensor, group_size: int | None) -> torch.Tensor:
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    if rewards.dim() == 2 and group_size in (None, rewards.shape[1]):
        return rewards
    if rewards.dim() == 1 and group_size is not None:
        if group_size < 1 or rewards.numel() % group_size != 0:
            raise VlrlError(
                f"{rewards.numel()} rewards cannot be split into groups of {group_size}; "
                "pass a multiple of the group size"
            )
        return rewards.reshape(-1, group_size)
    raise VlrlError(
        f"rewards must be [num_groups, G], or 1-D with group_size; got shape "
        f"{tuple(rewards.shape)} and group_size={group_size}"
    )


def discounted_returns(turn_rewards: Sequence[float], gamma: float) -> list[float]:
    """Return-to-go of every turn: R_t = sum_{k >= t} gamma^(k - t) * r_k."""
    out, running = [0.0] * len(turn_rewards), 0.0
    for t in range(len(turn_rewards) - 1, -1, -1):
        running = float(turn_rewards[t]) + gamma * running
        out[t] = running
    return out


def step_advantages(
    returns: Sequence[Sequence[float]],
    states: Sequence[Sequence[str]],
    group_size: int,
    *,
    scale: AdvantageScale = "std",
    eps: float = 1e-6,
) -> tuple[list[list[float]], float]:
    """GiGPO's step-level advantages (Feng et al. 2025), one per turn of every episode.

    Episodes come in consecutive groups of `group_size` (the G episodes of one task). Within a
    group, the turns that acted on the same environment state (`states[i][t]`, any hashable key:
    the "anchor state") form a step group, and each turn is compared with the others of its step
    group by its discounted return-to-go R_{i,t} (`discounted_returns`):
        scale="std":  A^S_{i,t} = (R_{i,t} - mean(R over the step group)) / (std + eps)
        scale="none": A^S_{i,t} =  R_{i,t} - mean(R over the step group)
    with the same conventions as `group_advantages` (unbiased std; a step group whose returns are
    all equal gets 0). A turn whose state no other turn of its group visited gets 0.
    Returns (per-episode lists of per-turn advantages, share of turns in a step group of >= 2).
    """
    if len(returns) != len(states) or any(len(r) != len(s) for r, s in zip(returns, states)):
        raise VlrlError("returns and states must have one entry per turn of every episode")
    if group_size < 1 or len(returns) % group_size:
        raise VlrlError(f"{len(returns)} episodes cannot be split into groups of {group_size}")
    out = [[0.0] * len(r) for r in returns]
    anchored = total = 0
    for g0 in range(0, len(returns), group_size):
        members: dict[str, list[tuple[int, int]]] = {}
        for i in range(g0, g0 + group_size):
            for t, state in enumerate(states[i]):
                members.setdefault(state, []).append((i, t))
        for turns in members.values():
            total += len(turns)
            if len(turns) < 2:
                continue
            anchored += len(turns)
            values = torch.tensor([[returns[i][t] for i, t in turns]], dtype=torch.float64)
            adv = group_advantages(values, scale=scale, eps=eps)[0].tolist()
            for (i, t), a in zip(turns, adv):
                out[i][t] = a
    return out, anchored / max(1, total)


def combine_advantages(
    episode_advantages: Sequence[float], step_advs: Sequence[Sequence[float]], weight: float
) -> list[list[float]]:
    """GiGPO's per-turn advantage: A_{i,t} = A^E_i + weight * A^S_{i,t} (weight = omega)."""
    if len(episode_advantages) != len(step_advs):
        raise VlrlError("one episode advantage and one list of step advantages per episode are needed")
    return [[float(a) + weight * s for s in steps] for a, steps in zip(episode_advantages, step_advs)]


def token_advantages(
    advantage: float | Sequence[float], spans: Sequence[tuple[int, int]], length: int
) -> torch.Tensor:
    """Advantage of every token of a sequence of `length` tokens, float32 [length].

    `advantage` is one value for the whole episode, or one per turn: turn t's value goes to the
    tokens of its response, `spans[t]` = [start, end). Tokens outside every response (prompt,
    environment) get 0; the loss mask leaves them out anyway.
    """
    out = torch.zeros(length, dtype=torch.float32)
    if isinstance(advantage, (int, float)):
        for start, end in spans:
            out[start:end] = float(advantage)
        return out
    if len(advantage) != len(spans):
        raise VlrlError(f"{len(advantage)} per-turn advantages for a sequence of {len(spans)} responses")
    for (start, end), a in zip(spans, advantage):
        out[start:end] = float(a)
    return out


# --- Masked reductions and loss aggregation ----------------------------------------------------


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) over `dim` (all elements if None). Masked-out NaN/inf are ignored."""
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) / sum(mask) over `dim`; 0 (not NaN) where the mask is empty."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "token_mean",
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar. n_i = number of masked tokens of sequence i.

    token_mean (DAPO):            sum_i sum_t l_it / sum_i n_i
    seq_mean_token_mean (GRPO):   mean_i ( sum_t l_it / n_i )
    seq_mean_token_sum (Dr. GRPO): mean_i ( sum_t l_it / C ), C = max_tokens, or 1 if None
    Sequences with n_i = 0 are left out of every mean over sequences; an all-empty batch gives 0.
    `max_tokens` is only used by seq_mean_token_sum.
    Note: over several micro-batches, token_mean of each is not the token_mean of the whole batch.
    """
    _check_same_shape(per_token_loss, mask, "per_token_loss", "mask")
    if mode == "token_mean":
        return masked_mean(per_token_loss, mask)
    tokens_per_seq = mask.bool().sum(dim=-1)
    seq_totals = masked_sum(per_token_loss, mask, dim=-1)
    if mode == "seq_mean_token_mean":
        per_seq = seq_totals / tokens_per_seq.clamp(min=1)
    elif mode == "seq_mean_token_sum":
        if max_tokens is not None and max_tokens < 1:
            raise VlrlError(f"max_tokens must be a positive integer, got {max_tokens}")
        per_seq = seq_totals if max_tokens is None else seq_totals / max_tokens
    else:
        raise VlrlError(
            f"loss aggregation must be token_mean, seq_mean_token_sum or seq_mean_token_mean, "
            f"got {mode!r}"
        )
    return masked_mean(per_seq, tokens_per_seq > 0)


# --- Policy loss -------------------------------------------------------------------------------


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    ratio_level: RatioLevel = "token",
    agg: Aggregation = "token_mean",
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss (Schulman et al. 2017) with GRPO-family options.

    ratio_level="token" (GRPO/DAPO): per token, r_t = exp(logp_t - old_logp_t),
        l_t = -min(r_t * A_i, clip(r_t, 1 - eps_low, 1 + eps_high) * A_i),
        reduced with `aggregate_loss(l, mask, agg, max_tokens)`.
        eps_high > eps_low (e.g. 0.28 vs 0.2) is DAPO's clip-higher.
    ratio_level="sequence" (plain GSPO, Zheng et al. 2025): per sequence,
        s_i = exp( (1/n_i) * sum_t (logp_t - old_logp_t) ),
        l_i = -min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i),
        loss = mean over non-empty sequences of l_i (`agg`/`max_tokens` do not apply).
        Gradient flows through the mean: d s_i / d logp_t = s_i / n_i for each masked t.
        (GSPO-token, s_it = sg[s_i] * exp(logp_t - sg[logp_t]), is not implemented.)
    `advantages` is [B], one per sequence, or [B, T], one per token (per-turn advantages of
    multi-turn episodes, GiGPO; token-level ratio only). Stats (detached 0-dim tensors) over masked tokens,
    or over non-empty sequences for GSPO: clip_fraction = share where the clipped branch is
    active and so the gradient is zero, i.e. (r > 1+eps_high and A > 0) or (r < 1-eps_low and
    A < 0), split into clip_high_fraction / clip_low_fraction; ratio_mean, ratio_min, ratio_max.
    """
    _check_same_shape(logprobs, old_logprobs, "logprobs", "old_logprobs")
    _check_same_shape(logprobs, mask, "logprobs", "mask")
    per_token = advantages.dim() == 2
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise VlrlError(
            f"advantages must have one value per sequence, shape {tuple(logprobs.shape[:1])}, or one "
            f"per token, shape {tuple(logprobs.shape)}; got {tuple(advantages.shape)}"
        )
    if per_token and ratio_level == "sequence":
        raise VlrlError("per-token (per-turn) advantages need ratio_level 'token'; GSPO's ratio is per sequence")
    if eps_low < 0 or eps_high < 0 or eps_low >= 1:
        raise VlrlError(
            f"clip range needs 0 <= eps_low < 1 and eps_high >= 0; got {eps_low}, {eps_high}"
        )
    # Zero the log-ratio on padding so exp() of garbage there cannot put NaN into the gradient.
    log_ratio = torch.where(mask.bool(), logprobs - old_logprobs, torch.zeros_like(logprobs))

    if ratio_level == "token":
        ratio, adv, counted = log_ratio.exp(), advantages if per_token else advantages[:, None], mask.bool()
    elif ratio_level == "sequence":
        ratio = masked_mean(log_ratio, mask, dim=-1).exp()
        adv, counted = advantages, mask.bool().any(dim=-1)
    else:
        raise VlrlError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")

    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    losses = -torch.minimum(unclipped, clipped)
    if ratio_level == "token":
        loss = aggregate_loss(losses, mask, agg, max_tokens)
    else:
        loss = masked_mean(losses, counted)

    with torch.no_grad():
        clip_high = (ratio > 1.0 + eps_high) & (adv > 0)
        clip_low = (ratio < 1.0 - eps_low) & (adv < 0)
        # Kept as tensors (no `if`), so logging them costs no host sync on a GPU.
        any_counted, one = counted.any(), ratio.new_tensor(1.0)
        lowest = ratio.masked_fill(~counted, float("inf")).min()
        highest = ratio.masked_fill(~counted, float("-inf")).max()
        stats = {
            "pg_loss": loss.detach(),
            "clip_fraction": masked_mean((clip_high | clip_low).float(), counted),
            "clip_high_fraction": masked_mean(clip_high.float(), counted),
            "clip_low_fraction": masked_mean(clip_low.float(), counted),
            "ratio_mean": masked_mean(ratio, counted),
            "ratio_min": torch.where(any_counted, lowest, one),
            "ratio_max": torch.where(any_counted, highest, one),
        }
    return loss, stats


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) (Schulman 2020), with d = ref_logp - logp:

    k3 = exp(d) - d - 1, which is >= 0 and exactly 0 where the log-probs are equal.
    """
    _check_same_shape(logprobs, ref_logprobs, "logprobs", "ref_logprobs")
    diff = ref_logprobs - logprobs
    return diff.exp() - diff - 1.0


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    ratio_level: RatioLevel = "token",
    agg: Aggregation = "token_mean",
    kl_coef: float = 0.0,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO objective: policy_loss(...) + kl_coef * aggregate_loss(k3, mask, agg, max_tokens).

    The KL term uses the same aggregation as the token-level policy term (for GSPO too). It is
    added only when kl_coef != 0, which needs ref_logprobs; ref_logprobs with kl_coef == 0 still
    reports "kl". Stats: those of `policy_loss`, plus "kl" (masked token mean of k3, when
    ref_logprobs is given) and "loss".
    """
    if kl_coef != 0.0 and ref_logprobs is None:
        raise VlrlError(
            f"kl_coef is {kl_coef} but no reference log-probs were given; pass them or set 0"
        )
    loss, stats = policy_loss(
        logprobs, old_logprobs, advantages, mask, eps_low=eps_low, eps_high=eps_high,
        ratio_level=ratio_level, agg=agg, max_tokens=max_tokens,
    )
    if ref_logprobs is not None:
        _check_same_shape(logprobs, ref_logprobs, "logprobs", "ref_logprobs")
        # As in policy_loss: padding gets d = 0, so k3 = 0 there and no NaN can leak through.
        safe_ref = torch.where(mask.bool(), ref_logprobs, logprobs.detach())
        per_token_kl = kl_k3(logprobs, safe_ref)
        if kl_coef != 0.0:
            loss = loss + kl_coef * aggregate_loss(per_token_kl, mask, agg, max_tokens)
        stats["kl"] = masked_mean(per_token_kl.detach(), mask)
    stats["loss"] = loss.detach()
    return loss, stats


# --- From logits -------------------------------------------------------------------------------


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, suppress: Sequence[int] = ()
) -> torch.Tensor:
    """log softmax(logits / temperature)[tokens], float32, shape [B, T].

    log p(x) = z_x / tau - logsumexp(z / tau), with the `suppress`ed token ids removed from the
    support (logit -inf): the distribution a sampler with `suppress_tokens` draws from, so the
    rollout engine and the policy's re-scoring use this one function. Computed one sequence at a
    time in float32, so the only extra memory is one [T, V] float32 copy, never a full
    [B, T, V] log_softmax.
    """
    if logits.shape[:-1] != tokens.shape:
        raise VlrlError(
            f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} must agree on [B, T]"
        )
    if temperature <= 0:
        raise VlrlError(f"temperature must be positive, got {temperature}")
    rows = []
    for row_logits, row_tokens in zip(logits, tokens):
        scaled = row_logits.float() / temperature if temperature != 1.0 else row_logits.float()
        if suppress:  # out of place: `scaled` may be the caller's own tensor
            scaled = scaled.index_fill(-1, torch.tensor(list(suppress), device=scaled.device), float("-inf"))
        picked = scaled.gather(-1, row_tokens.long()[:, None]).squeeze(-1)
        rows.append(picked - torch.logsumexp(scaled, dim=-1))
    return torch.stack(rows) if rows else logits.new_zeros(tokens.shape, dtype=torch.float32)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis, float32, shape [B, T].

    H = logsumexp(z) - sum_v p_v * z_v, with p = softmax(z); -inf logits (banned tokens) count 0.
    """
    rows = []
    for row_logits in logits:
        z = row_logits.float()
        probs = torch.softmax(z, dim=-1)
        finite_z = z.masked_fill(torch.isneginf(z), 0.0)
        rows.append(torch.logsumexp(z, dim=-1) - (probs * finite_z).sum(dim=-1))
    return torch.stack(rows) if rows else logits.new_zeros(logits.shape[:-1], dtype=torch.float32)


def _check_same_shape(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise VlrlError(
            f"{name_a} {tuple(a.shape)} and {name_b} {tuple(b.shape)} must have the same shape"
        )
