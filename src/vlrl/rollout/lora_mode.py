"""How the rollout engine serves the LoRA policy (`rollout.lora_mode`), and the check that it
still serves the trained one (`rollout.logprob_gap_tolerance`).

- `merged`: the vLLM engine starts without LoRA; every sync writes W0 + scale * B @ A into its
  weights in place (fp32 from the untouched base, rounded once): the decode runs at the base
  model's speed, without LoRA kernels.
- `adapter`: vLLM's LoRA kernels apply the adapter (the only mode of a separate server, and the
  CPU default: exact in fp32 and no per-sync weight rewrite).
- `auto` (default): merged on GPU with vLLM, adapter elsewhere.

The transformers engine samples with the policy's own PEFT modules (or its copy of them), so
there is nothing to merge: `merged` there is refused in one line, `auto`/`adapter` mean "as trained".

Either way the sampler's log-probs are the served policy's, and the trainer re-scores the same
tokens: `rollout/logprob_diff_mean` measures the gap, and `algo.rollout_correction` weighs by the
ratio of the two, so a merge's rounding (bf16) is corrected for like any other mismatch. A gap
past `rollout.logprob_gap_tolerance` is flagged (`logprob_gap_check`), never silent.
"""

from __future__ import annotations

import logging

from vlrl.errors import VlrlError

log = logging.getLogger(__name__)

LORA_MODES = ("auto", "merged", "adapter")


def resolve_lora_mode(requested: str, engine: str, use_gpu: bool) -> str:
    """`merged` or `adapter` for this engine (`vllm` or `transformers`) and device."""
    if requested not in LORA_MODES:
        raise VlrlError(f"unknown rollout.lora_mode {requested!r}; choose auto, merged or adapter")
    if engine != "vllm":
        if requested == "merged":
            raise VlrlError(
                f"rollout.lora_mode=merged needs rollout.engine=vllm; the {engine} engine samples with the policy's "
                "own LoRA modules (nothing to merge): use rollout.lora_mode=adapter (or auto) there"
            )
        return "adapter"
    if requested == "auto":
        return "merged" if use_gpu else "adapter"
    return requested


def resolve_sleep_level(requested: str | int, lora_mode: str, use_gpu: bool, world_size: int = 1) -> int:
    """vLLM's sleep level while the policy trains (`rollout.sleep_level`): 1 or 2.

    Level 2 drops the engine's weights instead of copying them to the host and back; the wake
    then rewrites all of them from the policy's frozen base on the same GPU, which only a merging
    engine does (`lora_mode=merged`). One worker only: on a group each weight would be all-gathered
    at every wake, and a wake is not a call every worker makes together.
    """
    if requested not in ("auto", 1, 2):
        raise VlrlError(f"unknown rollout.sleep_level {requested!r}; choose auto, 1 or 2")
    fits = lora_mode == "merged" and world_size == 1
    if requested == "auto":
        return 2 if fits and use_gpu else 1
    if requested == 2 and not fits:
        why = (
            f"needs rollout.lora_mode=merged (this engine serves the adapter by {lora_mode})"
            if lora_mode != "merged"
            else f"works with one worker per engine, not {world_size}"
        )
        raise VlrlError(
            "rollout.sleep_level=2 drops vLLM's weights while the policy trains and rewrites them from the policy's "
            f"base at the next wake; it {why}: use rollout.sleep_level=1 or auto"
        )
    return int(requested)


def logprob_gap_check(values: dict[str, float], tolerance: float, lora_mode: str = "") -> dict[str, float]:
    """`rollout/logprob_gap_exceeded` (0 or 1) from a step's `rollout/logprob_diff_mean`, with a
    warning when the gap is past `tolerance`; empty when the step measured no gap."""
    gap = values.get("rollout/logprob_diff_mean")
    if gap is None:
        return {}
    exceeded = not gap <= tolerance  # a NaN gap is past any tolerance
    if exceeded:
        log.warning(
            "sampler/trainer log-prob gap %.4g (mean |Delta logprob| per token, max %.4g) is past "
            "rollout.logprob_gap_tolerance=%g%s: the rollout engine no longer serves the policy being trained",
            gap,
            values.get("rollout/logprob_diff_max", float("nan")),
            tolerance,
            f" (rollout.lora_mode={lora_mode})" if lora_mode else "",
        )
    return {"rollout/logprob_gap_exceeded": float(exceeded)}
