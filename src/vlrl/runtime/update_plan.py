"""Planning one GRPO update over W data-parallel workers, and adding their stats back up.

One update (`vlrl.training.policy.Policy`) turns the step's episodes into optimizer steps
(mini-batches) and micro-batches. `make_update_plans` shuffles and cuts the mini-batches exactly
as one worker would, then gives each worker a contiguous share of every mini-batch, so the update
does not depend on the number of workers. Each micro-batch's loss is weighted by its share of
the WHOLE mini-batch (global token or sequence count, `UpdatePlan.denominators`) and by W, which
undoes FSDP's gradient averaging. FSDP collectives need every worker to run the same number of
forward/backward passes: workers with fewer micro-batches run zero-weight passes (`[]`), and the
old/reference scoring is padded the same way (`score_passes`).

Each worker returns partial stats per optimizer step; `combine_update_stats` adds them up.
Timings travel beside the stats, not in them (`UpdateStats.timings`), so the stats stay exactly
reproducible and equal across worker counts.

The plan lives here, not in the policy, because the driver (`vlrl.runtime.worker_group`) makes
the plans and each worker's policy runs its own (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from vlrl.config import AlgoConfig
from vlrl.rollout.sequence import MultimodalSequence


def loss_units(sequence: MultimodalSequence) -> int:
    """Tokens of a sequence that carry loss (those the policy sampled, after the first token)."""
    return sum(sequence.loss_mask[1:])


def split_evenly(items: list, parts: int) -> list[list]:
    """`parts` contiguous chunks whose sizes differ by at most one (the first ones larger)."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for p in range(parts):
        end = start + size + (1 if p < extra else 0)
        out.append(items[start:end])
        start = end
    return out


@dataclass
class UpdatePlan:
    """What one worker does in one GRPO update; every worker's plan has the same shape."""

    indices: list[int]  # positions (in the step's episode list) of the episodes this worker holds, ascending
    score_passes: int  # forward passes for old (and reference) log-probs, equal on every worker
    steps: list[list[list[int]]]  # per optimizer step: micro-batches of positions; [] is a zero-weight pass
    denominators: list[int]  # per optimizer step: the loss normaliser over the whole mini-batch
    world_size: int = 1


def make_update_plans(sizes: list[int], seed: int, algo: AlgoConfig, world_size: int = 1) -> list[UpdatePlan]:
    """Plans for `world_size` workers from the loss units of each episode (`loss_units`).

    The shuffle and the mini-batches are those of one worker (same `random.Random(seed)`), so
    the update does not depend on the number of workers. With ppo_epochs > 1 a worker holds the
    union of its shares over the epochs (and scores all of them), so workers hold more than 1/W
    of the episodes.
    """
    by_tokens = algo.loss_agg == "token_mean" and algo.ratio_level == "token"
    rng = random.Random(seed)
    steps: list[list[list[list[int]]]] = [[] for _ in range(world_size)]
    held: list[set[int]] = [set() for _ in range(world_size)]
    denominators: list[int] = []
    for _ in range(algo.ppo_epochs):
        order = list(range(len(sizes)))
        rng.shuffle(order)
        for m in range(0, len(order), algo.mini_batch_size):
            mini = order[m : m + algo.mini_batch_size]
            denominators.append(sum(sizes[i] for i in mini) if by_tokens else sum(1 for i in mini if sizes[i] > 0))
            shares = split_evenly(mini, world_size)
            micros = [
                [share[k : k + algo.micro_batch_size] for k in range(0, len(share), algo.micro_batch_size)]
                for share in shares
            ]
            passes = max(len(m_) for m_ in micros)
            for rank, (share, micro) in enumerate(zip(shares, micros)):
                steps[rank].append(micro + [[] for _ in range(passes - len(micro))])
                held[rank].update(share)
    # A worker with no episode still needs one to run its zero-weight passes through the model.
    indices = [sorted(h) if h else [0] for h in held]
    score_passes = max(-(-len(ix) // algo.micro_batch_size) for ix in indices)
    return [UpdatePlan(ix, score_passes, st, denominators, world_size) for ix, st in zip(indices, steps)]


class UpdateStats(dict):
    """The update's mean stats (a plain dict of floats) with its wall-clock `timings` beside them.

    `timings`: {"logprob_s": ..., "optim_s": ...}, seconds of the whole update. Kept out of the
    dict so that stats compare equal between runs and between worker counts.
    """

    def __init__(self, stats: dict[str, float], timings: dict[str, float] | None = None):
        super().__init__(stats)
        self.timings = dict(timings or {})


def combine_update_stats(partials: list[list[dict[str, float]]]) -> UpdateStats:
    """Per-worker, per-step partial stats (`Policy.run_plan`) -> the update's mean stats.

    Loss-like stats are sums of share-weighted micro-batch values, so they add up across
    workers; `*_max` / `*_min` keys are extremes over every micro-batch, worker and step (true
    extremes, not means of them); `mismatch_*` keys are raw sums over the tokens of one epoch,
    turned into the sampler/trainer gap (`MISMATCH_KEYS`); grad_norm and lr are global and the
    same on every worker (rank 0's is kept). Timings (`time_*` keys) are wall-clock: the slowest
    worker's, summed over the steps (not a mean); they go to `.timings` without the `time_` prefix.
    """
    totals: dict[str, float] = {}
    steps = len(partials[0]) if partials else 0
    for s in range(steps):
        merged: dict[str, float] = {}
        for rank, per_step in enumerate(partials):
            for k, v in per_step[s].items():
                if k in ("grad_norm", "lr"):
                    if rank == 0:
                        merged[k] = v
                elif k.startswith("time_"):
                    merged[k] = max(merged.get(k, 0.0), v)
                else:
                    merged[k] = merge_stat(k, merged.get(k), v)
        for k, v in merged.items():
            totals[k] = merge_stat(k, totals.get(k), v)
    stats = {
        k: v if k.endswith(("_max", "_min")) or k.startswith("mismatch_") else v / max(1, steps)
        for k, v in totals.items()
        if not k.startswith("time_")
    }
    tokens = stats.pop("mismatch_tokens", 0.0)
    abs_sum, k3_sum = stats.pop("mismatch_abs_sum", 0.0), stats.pop("mismatch_k3_sum", 0.0)
    if tokens > 0:
        stats["logprob_diff_mean"], stats["kl_sampler_trainer_k3"] = abs_sum / tokens, k3_sum / tokens
    return UpdateStats(stats, {k[len("time_") :]: v for k, v in totals.items() if k.startswith("time_")})


# The update's sampler-vs-trainer stats, which the trainer records as `rollout/<key>`.
MISMATCH_KEYS = ("logprob_diff_mean", "logprob_diff_max", "kl_sampler_trainer_k3")


def merge_stat(key: str, have: float | None, value: float) -> float:
    """Add up a stat over micro-batches, workers or steps: extremes for `*_max`/`*_min`, else sums."""
    if have is None:
        return value
    if key.endswith("_max"):
        return max(have, value)
    if key.endswith("_min"):
        return min(have, value)
    return have + value
