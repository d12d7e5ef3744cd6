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

from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.utils.checkpoint

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


def rare_best_share(rewards: torch.Tensor) -> float | None:
    """Of the groups with signal (rewards not all equal), the share whose best reward fewer than
    half of the episodes reached; None when no group has signal.

    It tells where a step's signal comes from. With a success reward, a group where most episodes
    lost and a few won is exploration finding what the policy mostly misses; one where most won and
    a few lost is mostly the policy's own random mistakes, which a near-deterministic policy's
    greedy choice does not make (bench/results/2026-12-03-h200-maze9-focus/).
    """
    grouped = _as_groups(rewards, None)
    with_signal = grouped[informative_groups(grouped)]
    if len(with_signal) == 0:
        return None
    best = with_signal == with_signal.max(dim=1, keepdim=True).values
    return float((best.float().mean(dim=1) < 0.5).float().mean())


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


def token_advantages(advantage: float | Sequence[float], spans: Sequence[tuple[int, int]], length: int) -> torch.Tensor:
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
        raise VlrlError(f"loss aggregation must be token_mean, seq_mean_token_sum or seq_mean_token_mean, got {mode!r}")
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
    is_weights: torch.Tensor | None = None,
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
    multi-turn episodes, GiGPO; token-level ratio only).
    `is_weights` (detached; [B, T] for the token ratio, [B] for the sequence ratio) multiply each
    token's (sequence's) loss before aggregation: the truncated importance weights of rollout
    correction (`rollout_correction_weights`). Stats (detached 0-dim tensors) over masked tokens,
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
        raise VlrlError(f"clip range needs 0 <= eps_low < 1 and eps_high >= 0; got {eps_low}, {eps_high}")
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
    if is_weights is not None:
        if is_weights.shape != losses.shape:
            raise VlrlError(
                f"is_weights must have shape {tuple(losses.shape)} for ratio_level {ratio_level!r}, got "
                f"{tuple(is_weights.shape)}"
            )
        losses = losses * is_weights.detach()
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
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO objective: policy_loss(...) + kl_coef * aggregate_loss(k3, mask, kl_agg, max_tokens).

    The KL term uses the policy term's aggregation (`kl_aggregation`): `agg` for the token-level
    ratio; for GSPO, whose policy term is a mean over sequences, a per-sequence one
    (seq_mean_token_mean, or `agg` when that is already per sequence), so that both terms are
    normalised by the same count and the loss does not depend on the micro-batching. It is
    added only when kl_coef != 0, which needs ref_logprobs; ref_logprobs with kl_coef == 0 still
    reports "kl". Stats: those of `policy_loss`, plus "kl" (masked token mean of k3, when
    ref_logprobs is given) and "loss".
    """
    if kl_coef != 0.0 and ref_logprobs is None:
        raise VlrlError(f"kl_coef is {kl_coef} but no reference log-probs were given; pass them or set 0")
    loss, stats = policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        eps_low=eps_low,
        eps_high=eps_high,
        ratio_level=ratio_level,
        agg=agg,
        max_tokens=max_tokens,
        is_weights=is_weights,
    )
    if ref_logprobs is not None:
        _check_same_shape(logprobs, ref_logprobs, "logprobs", "ref_logprobs")
        # As in policy_loss: padding gets d = 0, so k3 = 0 there and no NaN can leak through.
        safe_ref = torch.where(mask.bool(), ref_logprobs, logprobs.detach())
        per_token_kl = kl_k3(logprobs, safe_ref)
        if kl_coef != 0.0:
            loss = loss + kl_coef * aggregate_loss(per_token_kl, mask, kl_aggregation(agg, ratio_level), max_tokens)
        stats["kl"] = masked_mean(per_token_kl.detach(), mask)
    stats["loss"] = loss.detach()
    return loss, stats


def kl_aggregation(agg: Aggregation, ratio_level: RatioLevel) -> Aggregation:
    """The KL term's aggregation: `agg`, except that GSPO (a mean over sequences) never takes
    token_mean, which would weigh the KL by tokens and the policy term by sequences."""
    return "seq_mean_token_mean" if ratio_level == "sequence" and agg == "token_mean" else agg


def rollout_correction_weights(
    trainer_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: Literal["tis", "masked"],
    cap: float,
    ratio_level: RatioLevel = "token",
) -> torch.Tensor:
    """Importance weights against the sampler's distribution (detached), for `policy_loss(is_weights=...)`.

    The engine samples from a slightly different distribution than the trainer scores (bf16
    kernels, another engine); w = pi_trainer_old / pi_sampler corrects for it (verl/SkyRL
    "rollout correction"; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
    Off-Policy RL Training"). Token ratio: w_t = exp(old_t - sampler_t); sequence ratio (GSPO):
    w_i = exp(mean_t (old_t - sampler_t)), one per sequence, as GSPO's own ratio.
        tis:    min(w, cap)                  (truncated importance sampling)
        masked: 1 where w <= cap, else 0     (the token/sequence leaves the loss; it still counts
                                              in the normaliser, so the loss stays micro-batch free)
    Padding gets weight 0 (the loss mask leaves it out anyway).
    """
    _check_same_shape(trainer_logprobs, sampler_logprobs, "trainer_logprobs", "sampler_logprobs")
    if cap <= 0:
        raise VlrlError(f"the rollout correction cap must be positive, got {cap}")
    with torch.no_grad():
        log_w = torch.where(mask.bool(), trainer_logprobs - sampler_logprobs, torch.zeros_like(trainer_logprobs))
        if ratio_level == "sequence":
            log_w = masked_mean(log_w, mask, dim=-1)
        w = log_w.exp()
        if mode == "tis":
            return w.clamp(max=cap)
        if mode == "masked":
            return (w <= cap).to(w.dtype)
        raise VlrlError(f"rollout correction must be 'tis' or 'masked', got {mode!r}")


def sampler_mismatch(
    trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the sampler's log-probs are from the trainer's on the masked tokens (detached sums,
    to be added up over micro-batches and workers): abs_sum = sum |trainer - sampler|,
    abs_max = max |trainer - sampler|, k3_sum = sum of the k3 estimate of KL(sampler || trainer)
    (tokens were drawn from the sampler: d = trainer - sampler, k3 = exp(d) - d - 1), tokens."""
    _check_same_shape(trainer_logprobs, sampler_logprobs, "trainer_logprobs", "sampler_logprobs")
    with torch.no_grad():
        # A response the sampler did not sample (an exploring start) has NaN log-probs: not measured.
        keep = mask.bool() & sampler_logprobs.isfinite()
        diff = torch.where(keep, trainer_logprobs - sampler_logprobs, torch.zeros_like(trainer_logprobs))
        k3 = diff.exp() - diff - 1.0
        return {
            "abs_sum": diff.abs().sum(),
            "abs_max": diff.abs().max() if diff.numel() else diff.new_tensor(0.0),
            "k3_sum": k3.sum(),
            "tokens": keep.sum().to(diff.dtype),
        }


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
        raise VlrlError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} must agree on [B, T]")
    if temperature <= 0:
        raise VlrlError(f"temperature must be positive, got {temperature}")
    rows = [
        _rows_logprobs(row_logits, row_tokens, temperature, suppress)[0]
        for row_logits, row_tokens in zip(logits, tokens)
    ]
    return torch.stack(rows) if rows else logits.new_zeros(tokens.shape, dtype=torch.float32)


def _rows_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, suppress: Sequence[int], with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits / temperature)[tokens] of [N, V] logits rows (float32 [N]); the one
    formula behind `token_logprobs` and `head_logprobs`, so sampler and trainer agree exactly.
    With `with_entropy`, also the entropy of each row's distribution, without gradient."""
    scaled = logits.float() / temperature if temperature != 1.0 else logits.float()
    if suppress:  # out of place: `scaled` may be the caller's own tensor
        scaled = scaled.index_fill(-1, torch.tensor(list(suppress), device=scaled.device), float("-inf"))
    picked = scaled.gather(-1, tokens.long()[:, None]).squeeze(-1)
    logp = picked - torch.logsumexp(scaled, dim=-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(scaled.detach()[None])[0]
    return logp, entropy


def head_logprobs(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    tokens: torch.Tensor,
    temperature: float = 1.0,
    suppress: Sequence[int] = (),
    chunk_rows: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs(head(hidden), tokens, ...)` for [N, H] hidden rows, `chunk_rows` rows at a time.

    The LM head runs on the rows that carry loss only, never on prompt or image positions, and
    no [N, V] float32 logits outlive their chunk: with autograd on, each chunk is checkpointed
    (its logits are recomputed in backward instead of kept). Entropy (float32 [N], no gradient)
    comes from the same chunk's logits. Returns (log-probs [N] float32, entropy [N] or None).
    """
    if hidden.shape[:-1] != tokens.shape or hidden.dim() != 2:
        raise VlrlError(f"hidden {tuple(hidden.shape)} must be [N, H] rows for tokens {tuple(tokens.shape)} [N]")
    if chunk_rows < 1:
        raise VlrlError(f"chunk_rows must be a positive integer, got {chunk_rows}")
    if temperature <= 0:
        raise VlrlError(f"temperature must be positive, got {temperature}")
    grad = torch.is_grad_enabled() and hidden.requires_grad
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_rows):
        h, tok = hidden[start : start + chunk_rows], tokens[start : start + chunk_rows]
        if not grad:
            logp, ent = _rows_logprobs(head(h), tok, temperature, suppress, with_entropy)
        else:
            # The entropy is taken in the first forward only; the recomputation in backward skips it
            # (it saves nothing for backward, so the checkpoint's recorded tensors still match).
            first = [True]

            def chunk(h_: torch.Tensor, tok_: torch.Tensor, first=first):
                lp, en = _rows_logprobs(head(h_), tok_, temperature, suppress, with_entropy and first[0])
                first[0] = False
                return lp, en

            logp, ent = torch.utils.checkpoint.checkpoint(chunk, h, tok, use_reentrant=False)
        logps.append(logp)
        if ent is not None:
            entropies.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


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
        raise VlrlError(f"{name_a} {tuple(a.shape)} and {name_b} {tuple(b.shape)} must have the same shape")
