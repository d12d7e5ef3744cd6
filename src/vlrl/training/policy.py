"""The trainable policy: a LoRA-wrapped model, its optimizer and the GRPO update.

`Policy.update` is one GRPO update on a batch of episodes with their advantages:

    old log-probs   <- the policy before the update (no grad), per micro-batch; or the sampler's
    ref log-probs   <- the same model with the LoRA adapter disabled, or the frozen warm-start
                       adapter (only when kl_coef > 0)
    for each epoch, for each mini-batch (one optimizer step):
        for each micro-batch: loss = grpo_loss(...) * (its share of the mini-batch); backward
        clip the gradient norm; AdamW step; learning-rate schedule step
        (a non-finite gradient norm: no step at all while train.guards.nonfinite is on)

Log-probs are of `sequence[t+1]` given `sequence[:t+1]`; only tokens the policy sampled
(loss mask 1) count, never prompt or environment tokens. An episode's advantage is one number
(GRPO), or one per turn (GiGPO), which reaches its turn's tokens through the sequence's
`response_spans`.

Data parallel (W workers, FSDP2): each worker runs its share of the update by an `UpdatePlan`
(`vlrl.runtime.update_plan`: the mini-batches one worker would use, a contiguous share of each for
every worker, losses weighted by global token counts and W) and returns partial stats per
optimizer step, which `combine_update_stats` adds up across workers; timings travel beside the
stats (`UpdateStats.timings`: `logprob_s` for old + reference scoring, `optim_s` for the passes
and optimizer steps).
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch

from vlrl.algo.grpo import (
    entropy_from_logits,
    grpo_loss,
    head_logprobs,
    rollout_correction_weights,
    sampler_mismatch,
    token_advantages,
    token_logprobs,
)
from vlrl.config import RunConfig
from vlrl.errors import VlrlError
from vlrl.models.loading import count_parameters
from vlrl.models.qwen_vl_batched import forward_inputs, spatial_merge_size
from vlrl.models.regional_compile import CompiledBlocks, compile_blocks_enabled
from vlrl.rollout.episodes import Episode
from vlrl.rollout.sequence import MultimodalSequence, collate
from vlrl.runtime.update_plan import (
    UpdatePlan,
    UpdateStats,
    combine_update_stats,
    loss_units,
    make_update_plans,
    merge_stat,
)
from vlrl.training.guards import withholds_nonfinite


def lr_lambda(config: RunConfig, total_steps: int):
    """Linear warm-up, then constant, cosine or linear decay to zero, in optimizer steps."""
    warmup, kind = config.train.warmup_steps, config.train.lr_schedule

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1.0 - progress

    return factor


def lora_autocast_dtype(model: Any, compute_dtype: str) -> torch.dtype | None:
    """The autocast dtype of the policy's forward, or None (no autocast).

    PEFT keeps LoRA weights in float32 on a half-precision base and casts every LoRA layer's input
    to float32 to match them: on an 8B model that is a float32 copy of each projection's input,
    kept for the backward, and float32 adds and scalings after it. With `model.lora.compute_dtype
    = base` the policy's forward switches that casting off and runs under autocast in the base's
    dtype, so the LoRA matmuls take the same inputs as the frozen base and only the small LoRA
    weights are cast (their float32 values stay the optimizer's master copy, so small updates are
    not rounded away).
    """
    base_dtype = next((p.dtype for p in model.parameters() if not p.requires_grad), None)
    if compute_dtype == "float32" or base_dtype not in (torch.bfloat16, torch.float16):
        return None
    return base_dtype


@contextlib.contextmanager
def lora_input_casting_off(layers: list[Any]):
    """PEFT's cast of each LoRA input to the adapter's dtype, off for an update or a scoring pass,
    backward and recomputation included (a rollout engine may share the model and run it without
    autocast, so the switch is put back after)."""
    before = [getattr(layer, "cast_input_dtype_enabled", True) for layer in layers]
    for layer in layers:
        layer.cast_input_dtype_enabled = False
    try:
        yield
    finally:
        for layer, value in zip(layers, before):
            layer.cast_input_dtype_enabled = value


def _tuner_layers(model: Any) -> list[Any]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


class Policy:
    def __init__(
        self,
        model: Any,
        config: RunConfig,
        suppress_token_ids: list[int],
        pad_token_id: int,
        total_optimizer_steps: int,
        world_size: int = 1,
        reference_adapter: str | None = None,
    ):
        self.model = model
        # The KL reference: this frozen adapter of the model (a warm start), or None: the base (adapter disabled).
        self.reference_adapter = reference_adapter
        self.world_size = world_size
        self.config = config
        self.suppress = list(suppress_token_ids)
        self.pad_id = pad_token_id
        self.params = [p for p in model.parameters() if p.requires_grad]
        t = config.train
        self.optimizer = torch.optim.AdamW(self.params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(config, total_optimizer_steps))
        self.device = next(model.parameters()).device
        self.merge_size = spatial_merge_size(model)  # M-RoPE positions are computed on the CPU batch
        self.use_lora_compute_dtype(config.model.lora.compute_dtype)
        parameters = count_parameters(model)["total"]  # FSDP2's sharded DTensors count their full size
        self.compiled_blocks = CompiledBlocks(
            model, compile_blocks_enabled(config.train.compile_blocks, self.device, parameters)
        )

    def use_lora_compute_dtype(self, compute_dtype: str) -> None:
        """Switch `model.lora.compute_dtype` for the passes from here on (`base` or `float32`)."""
        self.autocast_dtype = lora_autocast_dtype(self.model, compute_dtype)
        self._lora_layers = [] if self.autocast_dtype is None else _tuner_layers(self.model)

    # -- scoring -------------------------------------------------------------------------
    def _forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = forward_inputs(batch, self.device, self.merge_size)
        if self.autocast_dtype is None:
            return self.model(**inputs, use_cache=False).logits
        with lora_input_casting_off(self._lora_layers), torch.autocast(self.device.type, dtype=self.autocast_dtype):
            return self.model(**inputs, use_cache=False).logits

    def _casting_off(self):
        return lora_input_casting_off(self._lora_layers)

    def score(self, sequences: list[MultimodalSequence], with_adapter: bool = True, entropy: bool = False):
        """Log-probs (and optionally entropies) of every next token; [B, T-1] tensors plus the batch."""
        batch = collate(sequences, self.pad_id, side="right")
        with self._adapter(with_adapter):
            logits = self._forward(batch)
        logits = logits[:, :-1]
        targets = batch["input_ids"][:, 1:].to(logits.device)
        logp = token_logprobs(logits, targets, self.config.rollout.temperature, self.suppress)
        ent = entropy_from_logits(logits.float() / self.config.rollout.temperature) if entropy else None
        return logp, ent, batch

    def score_tokens(self, sequences: list[MultimodalSequence], with_adapter: bool = True, entropy: bool = False):
        """Log-probs (and optionally entropies) of the tokens that carry loss; [B, T-1] tensors with 0
        at every other position, plus the batch.

        The loss pass: the model runs as usual, but its LM head is swapped (for this call only) for
        one that gathers the hidden rows where the loss mask is 1 (the logit at position t scores
        token t + 1) and applies the head, temperature, suppression and log-softmax to them in
        chunks of `algo.logit_chunk_size` rows (`head_logprobs`: checkpointed, so no [B, T, V]
        float32 logits outlive their chunk; entropy without autograd). Going through the model's
        own forward keeps PEFT and FSDP2 (whose root unshards the head's weight) in charge.
        `algo.logit_chunk_size = 0` takes the full-logits path (`score`) instead.
        """
        chunk = self.config.algo.logit_chunk_size
        if chunk == 0:
            return self.score(sequences, with_adapter=with_adapter, entropy=entropy)
        batch = collate(sequences, self.pad_id, side="right")
        mask = batch["loss_mask"][:, 1:].bool()
        rows = mask.nonzero(as_tuple=True)
        tokens = batch["input_ids"][:, 1:][rows].to(self.device)
        rows_dev = tuple(r.to(self.device) for r in rows)
        head = self._lm_head()
        original = head.forward
        gathered: dict[str, torch.Tensor | None] = {}

        def head_forward(hidden: torch.Tensor) -> torch.Tensor:
            logp, gathered["entropy"] = head_logprobs(
                hidden[rows_dev], original, tokens, self.config.rollout.temperature, self.suppress, chunk, entropy
            )
            return logp

        head.forward = head_forward  # an instance attribute shadows the class's forward
        try:
            with self._adapter(with_adapter):
                logp_rows = self._forward(batch)
        finally:
            del head.forward
        logp = torch.zeros(mask.shape, dtype=torch.float32, device=logp_rows.device).index_put(rows_dev, logp_rows)
        ent = None
        if entropy:
            ent = torch.zeros(mask.shape, dtype=torch.float32, device=logp_rows.device).index_put(
                rows_dev, gathered["entropy"]
            )
        return logp, ent, batch

    def _adapter(self, trained: bool):
        """The context of a forward: the trained adapter, or the KL reference (the frozen warm-start
        adapter when there is one, else the base with the adapter disabled)."""
        from vlrl.models.lora import using_adapter

        if trained:
            return contextlib.nullcontext()
        if self.reference_adapter is not None:
            return using_adapter(self.model, self.reference_adapter)
        return self.model.disable_adapter()

    def _lm_head(self) -> torch.nn.Module:
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        head = getattr(base, "lm_head", None)
        if not isinstance(head, torch.nn.Module) or "forward" in vars(head):
            raise VlrlError(
                f"{type(base).__name__} has no plain `lm_head` module; set algo.logit_chunk_size=0 (full logits)"
            )
        return head

    @torch.no_grad()
    def score_no_grad(
        self, sequences: list[MultimodalSequence], with_adapter: bool = True, passes: int | None = None
    ) -> list[torch.Tensor]:
        """Per-sequence log-prob vectors (length len-1), micro-batch by micro-batch; only the
        positions whose token carries loss are scored (`score_tokens`), the others hold 0.

        `passes` (sharded policy): run forward passes up to this many, the extra ones on the first
        sequence with their output dropped, so every worker enters the same collectives.
        """
        out: list[torch.Tensor] = []
        mb = self.config.algo.micro_batch_size
        was = self.model.training
        self.model.eval()
        for s in range(0, len(sequences), mb):
            chunk = sequences[s : s + mb]
            logp, _, _ = self.score_tokens(chunk, with_adapter=with_adapter)
            out += [logp[i, : len(seq) - 1].cpu() for i, seq in enumerate(chunk)]
        for _ in range((passes or 0) - -(-len(sequences) // mb)):
            self.score_tokens(sequences[:1], with_adapter=with_adapter)
        self.model.train(was)
        return out

    # -- update --------------------------------------------------------------------------
    def update(self, episodes: list[Episode], advantages: list[float] | list[list[float]], seed: int) -> UpdateStats:
        """One GRPO update (ppo_epochs x mini-batches) on these episodes; returns mean stats (+ timings)."""
        plan = make_update_plans([loss_units(e.sequence) for e in episodes], seed, self.config.algo, 1)[0]
        return combine_update_stats([self.run_plan(episodes, advantages, plan)])

    def run_plan(self, episodes: list[Episode], advantages: list[float], plan: UpdatePlan) -> list[dict[str, float]]:
        """This worker's part of an update: `episodes`/`advantages` are those at `plan.indices`.

        Returns per optimizer step the partial stats to add up across workers (with `time_*` keys
        that `combine_update_stats` moves to `UpdateStats.timings`).
        """
        if len(episodes) != len(plan.indices) or len(advantages) != len(plan.indices):
            raise ValueError(
                f"the plan holds {len(plan.indices)} episodes, got {len(episodes)} episodes and {len(advantages)} "
                "advantages"
            )
        # The backward (and any recomputation) too, not the forward only.
        with self._casting_off(), self.compiled_blocks.active():
            return self._run_plan(episodes, advantages, plan)

    def _run_plan(self, episodes: list[Episode], advantages: list[float], plan: UpdatePlan) -> list[dict[str, float]]:
        at = {g: k for k, g in enumerate(plan.indices)}
        seqs = [e.sequence for e in episodes]
        start = time.perf_counter()
        # With a single optimizer step the policy being updated IS the one that sampled, so the
        # trainer's "old" log-probs equal the loss pass's own, detached (as verl/TRL do): one
        # forward saved. With several, the policy re-scores the batch before the first step (also
        # when `algo.old_logprobs = sampler`: the sampler/trainer gap is measured against them).
        on_policy = len(plan.steps) == 1
        trainer_old = None if on_policy else self.score_no_grad(seqs, with_adapter=True, passes=plan.score_passes)
        ref = (
            self.score_no_grad(seqs, with_adapter=False, passes=plan.score_passes)
            if self.config.algo.kl_coef > 0
            else None
        )
        scoring_s = time.perf_counter() - start
        self.model.train()
        out = []
        steps_per_epoch = len(plan.steps) // self.config.algo.ppo_epochs
        for s, (micro_batches, denom) in enumerate(zip(plan.steps, plan.denominators)):
            local = [[at[i] for i in micro] for micro in micro_batches]
            start = time.perf_counter()
            # The first epoch sees every episode once: that is where the sampler/trainer gap is measured.
            stats = self._optimizer_step(
                local, seqs, advantages, trainer_old, ref, denom, measure_mismatch=s < steps_per_epoch
            )
            stats["time_optim_s"] = time.perf_counter() - start
            out.append(stats)
        if out:  # the scoring happens once per update; book it on the first step (steps are summed)
            out[0]["time_logprob_s"] = scoring_s
        return out

    def _optimizer_step(
        self, micro_batches, seqs, advantages, trainer_old, ref, denom, measure_mismatch=False
    ) -> dict[str, float]:
        """One optimizer step over this worker's micro-batches (local positions; [] = zero-weight pass).

        `trainer_old`: the policy's log-probs before the update (None: this step's own, detached).
        The "old" log-probs of the ratio are those or the sampler's (`algo.old_logprobs`); with
        `algo.rollout_correction`, each token's loss is weighted against the sampler.
        """
        from vlrl.runtime.distributed import to_float

        self.optimizer.zero_grad(set_to_none=True)
        acc = self.accumulate_gradients(micro_batches, seqs, advantages, trainer_old, ref, denom, measure_mismatch)
        if denom == 0:
            # Nothing to learn from: as on one worker, no gradient at all (zero-weight passes left zeros).
            self.optimizer.zero_grad(set_to_none=True)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.config.train.max_grad_norm)
        acc["grad_norm"] = to_float(grad_norm)
        acc["lr"] = self.optimizer.param_groups[0]["lr"]
        if not math.isfinite(acc["grad_norm"]) and withholds_nonfinite(self.config.train.guards):
            # The stability guard (train.guards.nonfinite) decides what happens to the run; a NaN
            # gradient would make the adapter and AdamW's moments NaN, so it is never applied.
            # The norm is global (the same on every worker), so all workers withhold together.
            self.optimizer.zero_grad(set_to_none=True)
            return acc
        self.optimizer.step()
        self.scheduler.step()
        return acc

    def accumulate_gradients(
        self, micro_batches, seqs, advantages, trainer_old, ref, denom, measure_mismatch=False
    ) -> dict[str, float]:
        """Forward/backward of every micro-batch into the parameters' `.grad` (no optimizer step);
        returns the partial stats. Each micro-batch's loss is weighted by its share of the
        mini-batch's normaliser `denom`, so the sum does not depend on how it is cut."""
        a = self.config.algo
        by_tokens = a.loss_agg == "token_mean" and a.ratio_level == "token"
        acc: dict[str, float] = {}
        for micro in micro_batches:
            if not micro:
                self._zero_weight_pass(seqs[0])
                continue
            sizes = [loss_units(seqs[i]) for i in micro]
            share = (sum(sizes) if by_tokens else sum(1 for n in sizes if n > 0)) / max(1, denom)
            if share == 0:
                if self.world_size == 1:
                    continue
                self._zero_weight_pass(seqs[micro[0]])
                continue
            logp, ent, batch = self.score_tokens([seqs[i] for i in micro], entropy=True)
            mask = batch["loss_mask"][:, 1:].to(logp.device)
            # Prompt positions hold image tokens, which are suppressed (log-prob -inf). They are
            # masked out of the loss, but the k3 KL's exp(-inf - -inf) would still put NaN into
            # the gradient (0 * NaN), so they are zeroed here.
            logp = torch.where(mask.bool(), logp, torch.zeros_like(logp))
            sampler_b = batch["sample_logprobs"][:, 1:].to(logp.device)
            trainer_b = (
                logp.detach()
                if trainer_old is None
                else _pad_stack([trainer_old[i] for i in micro], logp.shape[1], logp.device)
            )
            old_b = sampler_b if a.old_logprobs == "sampler" else trainer_b
            is_weights = None
            if a.rollout_correction != "off":
                is_weights = rollout_correction_weights(
                    trainer_b, sampler_b, mask, a.rollout_correction, a.rollout_correction_cap, a.ratio_level
                )
            ref_b = _pad_stack([ref[i] for i in micro], logp.shape[1], logp.device) if ref is not None else None
            if any(isinstance(advantages[i], (list, tuple)) for i in micro):
                # Per-turn advantages (GiGPO): one value per token; column t scores token t + 1.
                length = logp.shape[1] + 1
                adv = torch.stack(
                    [token_advantages(advantages[i], seqs[i].response_spans, length)[1:] for i in micro]
                ).to(logp.device)
            else:
                adv = torch.tensor([advantages[i] for i in micro], dtype=torch.float32, device=logp.device)
            loss, stats = grpo_loss(
                logp,
                old_b,
                ref_b,
                adv,
                mask,
                eps_low=a.eps_low,
                eps_high=a.eps_high,
                ratio_level=a.ratio_level,
                agg=a.loss_agg,
                kl_coef=a.kl_coef,
                max_tokens=self.config.rollout.max_new_tokens,
                is_weights=is_weights,
            )
            # x world_size: FSDP averages gradients over workers; we want their sum.
            (loss * (share * self.world_size)).backward()
            n_tok = mask.sum().clamp(min=1)
            extra = {"loss": float(loss.detach()), "entropy": float((ent.detach() * mask).sum() / n_tok)}
            for k, v in {**{k: float(v) for k, v in stats.items()}, **extra}.items():
                acc[k] = merge_stat(k, acc.get(k), v if k.endswith(("_max", "_min")) else v * share)
            if measure_mismatch:
                gap = {k: float(v) for k, v in sampler_mismatch(trainer_b, sampler_b, mask).items()}
                for k in ("abs_sum", "k3_sum", "tokens"):
                    acc[f"mismatch_{k}"] = acc.get(f"mismatch_{k}", 0.0) + gap[k]
                acc["logprob_diff_max"] = max(acc.get("logprob_diff_max", 0.0), gap["abs_max"])
        return acc

    def set_lr_scale(self, scale: float) -> None:
        """Multiply the learning rate of every later optimizer step by `scale` (relative to
        train.lr; a guard's rollback lowers it). The scheduler's base LRs carry it into checkpoints."""
        base = self.config.train.lr * scale
        self.scheduler.base_lrs = [base for _ in self.optimizer.param_groups]
        factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
        for group in self.optimizer.param_groups:
            group["initial_lr"] = base
            group["lr"] = base * factor

    def _zero_weight_pass(self, sequence: MultimodalSequence) -> None:
        """Forward and backward through the whole model with zero gradient (keeps FSDP collectives in step).

        Raw logits, not log-probs: a prompt's image tokens are suppressed tokens with log-prob
        -inf, and 0 * inf would put NaN into the gradients.
        """
        logits = self._forward(collate([sequence], self.pad_id, side="right"))
        (logits.float().mean() * 0.0).backward()


def _pad_stack(rows: list[torch.Tensor], length: int, device) -> torch.Tensor:
    out = torch.zeros((len(rows), length), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out.to(device)
