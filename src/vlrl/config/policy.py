"""The policy side of a run's config: the base model and its LoRA, the rollout engine and sampling, the
GRPO-family algorithm and its presets."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from vlrl.sections import Section

# --------------------------------------------------------------------------------------------
# model


class LoraConfig(Section):
    rank: int = Field(16, ge=1, le=1024, description="LoRA rank r.")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling numerator; the update is scaled by alpha/rank.")
    dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on the LoRA input (0 keeps rollouts and training identical)."
    )
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Linear layers of the language model that get LoRA adapters.",
    )
    include_vision: bool = Field(False, description="Also adapt the vision tower's linear layers.")
    compute_dtype: Literal["base", "float32"] = Field(
        "base",
        description="Dtype of the LoRA matmuls in the trainer's forward and backward. `base`: the base model's "
        "(a bfloat16/float16 base runs its forward under autocast, so each LoRA input stays in that dtype; the "
        "adapter's float32 weights stay the optimizer's master copy). `float32`: PEFT's upcast, which copies every "
        "LoRA input to float32 and keeps that copy for the backward. The same thing on a float32 base.",
    )


# The presets of `vlrl.models.tiny.build_tiny_model` (one list: the model builder and the CLI read it here).
TinyPreset = Literal["ci", "demo", "maze9", "qwen3vl-2b-shape", "qwen3vl-8b-shape"]


class ModelConfig(Section):
    path: str = Field(
        "runs/models/tiny-ci",
        description="Local directory of a Qwen3-VL checkpoint (or one built by `vlrl model init-tiny`). Never "
        "downloaded.",
    )
    init_tiny: TinyPreset | None = Field(
        None,
        description="If set and `path` does not exist, build a random tiny model of this preset there first (offline).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Parameter dtype of the policy.")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field("sdpa", description="Attention kernel.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapter shape.")


# --------------------------------------------------------------------------------------------
# environment: each env declares its own config class (`vlrl.envs.config.EnvConfigBase`), which
# validates `RunConfig.env` when `env.name` selects it; this module knows none of their fields.


# --------------------------------------------------------------------------------------------
# rollout


class RolloutConfig(Section):
    engine: Literal["auto", "transformers", "vllm"] = Field(
        "auto", description="Rollout engine; `auto` picks vLLM when installed, else transformers."
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature for training rollouts.")
    top_p: float = Field(
        1.0, gt=0, le=1, description="Nucleus sampling (keep 1.0 for unbiased policy-gradient log-probs)."
    )
    max_new_tokens: int = Field(32, ge=1, description="Token budget of one model turn.")
    batch_size: int = Field(64, ge=1, description="Most conversations sent to the engine in one generate call.")
    max_batch_tokens: int | None = Field(
        None,
        ge=64,
        description="transformers engine: most prompt tokens in one prefill (rows x longest prompt, padding "
        "included); a batch over it is split. Long multi-turn conversations (e.g. 13x13 mazes over 18 turns) "
        "otherwise need memory in proportion to batch_size x length. None: batch_size alone decides.",
    )
    max_model_len: int = Field(4096, ge=64, description="Longest conversation (prompt + all turns) in tokens.")
    gpu_memory_utilization: float | Literal["auto"] = Field(
        0.5,
        description="vLLM on GPU: share of the GPU's total memory for its weights + KV cache, next to the policy "
        "(0 < x <= 1); `auto` takes what is free after the policy is loaded, less 4 GiB. A share that leaves no room "
        "for the policy is refused with both numbers before vLLM starts.",
    )
    kv_cache_memory_mb: int = Field(256, ge=16, description="vLLM on CPU: KV cache size in MiB (must be set on CPU).")
    lora_mode: Literal["auto", "merged", "adapter"] = Field(
        "auto",
        description="vLLM engine: how it serves the LoRA policy. `merged`: vLLM starts without LoRA and every sync "
        "writes W0 + scale*B@A (fp32 from the untouched base, rounded once) into its weights in place, vision tower "
        "included; `adapter`: vLLM's LoRA kernels apply the adapter. `auto`: merged on GPU, adapter on CPU. The "
        "transformers engine applies the policy's own LoRA modules: only auto or adapter there (docs/vllm.md).",
    )
    merged_base: Literal["policy", "copy"] = Field(
        "policy",
        description="lora_mode=merged: where the untouched base W0 comes from. `policy`: the policy's frozen base "
        "weights on the same device (no extra memory; all-gathered weight by weight on a sharded policy); `copy`: the "
        "engine keeps its own copy of the LoRA-targeted checkpoint tensors on its device.",
    )
    sleep_level: Literal["auto", 1, 2] = Field(
        "auto",
        description="vLLM on GPU: what the engine does with its weights while the policy trains. 1: they move to "
        "host memory and back (a round trip of the whole model per step); 2: they are dropped and the next wake "
        "rewrites every weight from the policy's base on the same GPU (merged LoRA included), so nothing crosses "
        "to the host; needs rollout.lora_mode=merged and one worker per engine. `auto`: 2 where it applies, else 1.",
    )
    sleep_unmap: Literal["all", "large"] = Field(
        "all",
        description="vLLM on GPU at sleep level 2: what the sleep unmaps. `all`: vLLM's own `LLM.sleep(level=2)` "
        "(every allocation; it also resets the prefix cache). `large`: the engine's own unmapping of the KV cache "
        "and of the weight allocations of >= 64 MiB that hold no buffer; the small ones stay mapped (~4 GiB at "
        "8B shape), which makes the wake cheaper (mapping back costs per allocation). Falls back to `all` where "
        "vLLM's allocator lacks the hook (docs/vllm.md).",
    )
    logprob_gap_tolerance: float = Field(
        0.1,
        gt=0,
        description="Largest mean |sampler - trainer| token log-prob gap (`rollout/logprob_diff_mean`) before a step "
        "is flagged (`rollout/logprob_gap_exceeded` = 1 and a warning): the served policy has drifted from the "
        "trained one. Observed: ~1e-6 in fp32, 0.002-0.05 in bf16 (tiny to 8B shape).",
    )
    fast_decode: bool | Literal["auto"] = Field(
        "auto",
        description=(
            "transformers engine: decode with a static KV cache and one CUDA graph per step, no host sync until the "
            "last token, LoRA unmerged (Qwen3-VL; top_p 1, no stop strings). `auto`: on CUDA only; true: also on CPU "
            "(eager, for tests); false: always transformers `generate` (the CPU default path)."
        ),
    )
    compile_decode: bool = Field(
        False,
        description="transformers engine, fast decode on CUDA: also torch.compile the decode step (a compile per "
        "batch shape).",
    )
    vision_cache_mb: int | None = Field(
        None,
        ge=0,
        description="transformers engine, fast decode: MiB of vision-tower outputs kept on the device across turns, "
        "so each "
        "turn's prefill encodes (and copies the pixels of) only the images it has not seen; null: 4096 on CUDA, 256 on "
        "CPU; 0: off. Dropped whenever the weights change.",
    )

    @model_validator(mode="after")
    def _check_memory_share(self):
        share = self.gpu_memory_utilization
        if share != "auto" and not 0 < share <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1] or auto, got {share}")
        return self


# --------------------------------------------------------------------------------------------
# algorithm

# The published settings of each algorithm (`algo.preset`); docs/training.md has the table.
ALGO_PRESETS: dict[str, dict[str, Any]] = {
    # Shao et al. 2024: std-normalised advantages, mean over sequences of per-sequence token means.
    "grpo": {
        "advantage": "grpo",
        "loss_agg": "seq_mean_token_mean",
        "ratio_level": "token",
        "eps_low": 0.2,
        "eps_high": 0.2,
        "dynamic_sampling": False,
    },
    # Liu et al. 2025: no std division, per-sequence token SUMS over a constant (max_new_tokens).
    "dr_grpo": {
        "advantage": "dr_grpo",
        "loss_agg": "seq_mean_token_sum",
        "ratio_level": "token",
        "eps_low": 0.2,
        "eps_high": 0.2,
        "dynamic_sampling": False,
    },
    # Yu et al. 2025: clip-higher, token-level mean, dynamic sampling.
    "dapo": {
        "advantage": "grpo",
        "loss_agg": "token_mean",
        "ratio_level": "token",
        "eps_low": 0.2,
        "eps_high": 0.28,
        "dynamic_sampling": True,
    },
    # Zheng et al. 2025: sequence-level ratio with its much narrower clip range (3e-4 / 4e-4).
    "gspo": {
        "advantage": "grpo",
        "loss_agg": "seq_mean_token_mean",
        "ratio_level": "sequence",
        "eps_low": 3e-4,
        "eps_high": 4e-4,
        "dynamic_sampling": False,
    },
}


class AlgoConfig(Section):
    group_size: int = Field(8, ge=2, description="Episodes per task (G); advantages are normalised within a group.")
    tasks_per_step: int = Field(8, ge=1, description="Tasks (groups) per training step; episodes per step = tasks * G.")
    advantage: Literal["grpo", "dr_grpo"] = Field(
        "grpo", description="`grpo`: (r - mean) / std in the group; `dr_grpo`: r - mean (no std division)."
    )
    step_advantage_weight: float = Field(
        0.0,
        ge=0,
        description="GiGPO (multi-turn): weight of the step-level advantage, which compares turns of a group that "
        "faced the "
        "same state by their discounted return; added to the episode advantage per turn. 0: plain episode-level GRPO.",
    )
    step_discount: float = Field(
        0.95, gt=0, le=1, description="GiGPO: discount of the return-to-go that step-level advantages compare."
    )
    dynamic_sampling: bool = Field(False, description="Drop groups whose rewards are all equal and sample more (DAPO).")
    exploring_starts: bool = Field(
        False,
        description="Multi-turn: every legal first move is tried. The first episodes of each group take the env's "
        "legal first moves (`Env.legal_responses`; the maze: the unblocked moves), the rest sample as usual, so each "
        "group compares every first move by what followed it. The forced moves have no sampling log-prob: needs "
        "old_logprobs 'trainer' and rollout_correction 'off'.",
    )
    max_resample_rounds: int = Field(3, ge=0, description="With dynamic sampling: extra rounds to refill the batch.")
    eps_low: float = Field(0.2, ge=0, lt=1, description="Lower clip of the importance ratio: 1 - eps_low.")
    eps_high: float = Field(
        0.28, ge=0, description="Upper clip of the importance ratio: 1 + eps_high (DAPO clip-higher)."
    )
    ratio_level: Literal["token", "sequence"] = Field("token", description="`token` (PPO/GRPO) or `sequence` (GSPO).")
    loss_agg: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"] = Field(
        "token_mean", description="How per-token losses become one number."
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the k3 KL penalty to the reference: the policy GRPO started from (the base, or the "
        "base with the `--init-adapter` warm start).",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch of episodes.")
    shuffle_advantages: bool = Field(
        False,
        description="Control arm (signal vs noise): permute the batch's advantages across its episodes before the "
        "update, so each episode's update direction no longer follows its own reward. Seeded by train.seed and the "
        "step (exact resumes stay exact). A run that learns as well with it on learned from the update's noise, not "
        "from the reward.",
    )
    mini_batch_size: int = Field(64, ge=1, description="Episodes per optimizer step.")
    micro_batch_size: int = Field(8, ge=1, description="Episodes per forward/backward (gradient accumulation).")
    preset: Literal["grpo", "dr_grpo", "dapo", "gspo"] | None = Field(
        None,
        description="Set advantage, loss_agg, ratio_level, eps_low/eps_high and dynamic_sampling together as the "
        "paper does (table in docs/training.md); fields given explicitly still win. None: each field's own default.",
    )
    old_logprobs: Literal["trainer", "sampler"] = Field(
        "trainer",
        description="The 'old' log-probs of the importance ratio with several optimizer steps per batch: `trainer` "
        "(the policy re-scores the batch before the update) or `sampler` (the engine's sampling log-probs).",
    )
    rollout_correction: Literal["off", "tis", "masked"] = Field(
        "off",
        description="Correct for the sampler/trainer mismatch with the weight w = pi_trainer_old / pi_sampler: `tis` "
        "multiplies each token's loss by min(w, cap), `masked` drops tokens with w > cap (per sequence for GSPO). "
        "`off`: no weight.",
    )
    rollout_correction_cap: float = Field(
        2.0, gt=0, description="The cap of `rollout_correction` (TIS truncation, or the masking threshold)."
    )
    logit_chunk_size: int = Field(
        1024,
        ge=0,
        description="Loss pass: the LM head and log-softmax run on the tokens that carry loss only, this many rows at "
        "a time, recomputed in backward (no [B, T, V] logits kept). 0: full logits at every position (the former path, "
        "for comparison).",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        return apply_algo_preset(data)

    @model_validator(mode="after")
    def _exploring_starts_need_trainer_logprobs(self) -> AlgoConfig:
        if self.exploring_starts and (self.old_logprobs == "sampler" or self.rollout_correction != "off"):
            raise ValueError(
                "exploring_starts: the forced first moves have no sampling log-probs; set algo.old_logprobs=trainer "
                "and algo.rollout_correction=off"
            )
        return self

    @model_validator(mode="after")
    def _shuffle_needs_episode_advantages(self) -> AlgoConfig:
        if self.shuffle_advantages and self.step_advantage_weight > 0:
            raise ValueError(
                "shuffle_advantages permutes episode-level advantages; with step_advantage_weight > 0 (GiGPO) the "
                "per-turn advantages would still follow each episode's own turns. Set step_advantage_weight=0 for the "
                "control arm"
            )
        return self


def apply_algo_preset(algo: Any) -> Any:
    """The `algo` mapping with its preset's fields filled in where the user did not give them
    (explicit fields win). Applied to what the user wrote, before the defaults are merged in."""
    if isinstance(algo, dict) and isinstance(algo.get("preset"), str) and algo["preset"] in ALGO_PRESETS:
        return {**ALGO_PRESETS[algo["preset"]], **algo}  # an unknown name is left to the field's own error
    return algo


# --------------------------------------------------------------------------------------------
