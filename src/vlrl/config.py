"""One typed configuration for a whole run.

A run is described by a `RunConfig`: a YAML file (see `configs/`) plus dotted command-line
overrides such as `algo.group_size=8`. Every field below has a type, a default and a description;
`vlrl config show --doc` prints them all. Unknown keys, wrong types and impossible values are
errors that name the key and the file, with a did-you-mean suggestion for typos.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from vlrl.envs.base import DEFAULT_ENV, default_env_config, env_config, env_config_class
from vlrl.envs.config import EnvConfigBase
from vlrl.errors import ConfigError, VlrlError
from vlrl.sections import Section, closest  # noqa: F401  (Section re-exported for `from vlrl.config import Section`)

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
        "otherwise need "
        "memory in proportion to batch_size x length. None: batch_size alone decides.",
    )
    max_model_len: int = Field(4096, ge=64, description="Longest conversation (prompt + all turns) in tokens.")
    gpu_memory_utilization: float | Literal["auto"] = Field(
        0.5,
        description="vLLM on GPU: share of the GPU's total memory for its weights + KV cache, next to the policy "
        "(0 < x <= 1); `auto` takes what is free after the policy is loaded, less 4 GiB. A share that leaves no room "
        "for the policy is refused with both numbers before vLLM starts.",
    )
    kv_cache_memory_mb: int = Field(256, ge=16, description="vLLM on CPU: KV cache size in MiB (must be set on CPU).")
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
        "same state by their discounted return; added to the episode advantage per turn. 0: plain episode-level "
        "GRPO.",
    )
    step_discount: float = Field(
        0.95, gt=0, le=1, description="GiGPO: discount of the return-to-go that step-level advantages compare."
    )
    dynamic_sampling: bool = Field(False, description="Drop groups whose rewards are all equal and sample more (DAPO).")
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
        "base with "
        "the `--init-adapter` warm start).",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch of episodes.")
    mini_batch_size: int = Field(64, ge=1, description="Episodes per optimizer step.")
    micro_batch_size: int = Field(8, ge=1, description="Episodes per forward/backward (gradient accumulation).")
    preset: Literal["grpo", "dr_grpo", "dapo", "gspo"] | None = Field(
        None,
        description="Set advantage, loss_agg, ratio_level, eps_low/eps_high and dynamic_sampling together as the "
        "paper does "
        "(table in docs/training.md); fields given explicitly still win. None: each field's own default.",
    )
    old_logprobs: Literal["trainer", "sampler"] = Field(
        "trainer",
        description="The 'old' log-probs of the importance ratio with several optimizer steps per batch: `trainer` "
        "(the "
        "policy re-scores the batch before the update) or `sampler` (the engine's sampling log-probs).",
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
        "a time, "
        "recomputed in backward (no [B, T, V] logits kept). 0: full logits at every position (the former path, "
        "for comparison).",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        return apply_algo_preset(data)


def apply_algo_preset(algo: Any) -> Any:
    """The `algo` mapping with its preset's fields filled in where the user did not give them
    (explicit fields win). Applied to what the user wrote, before the defaults are merged in."""
    if isinstance(algo, dict) and isinstance(algo.get("preset"), str) and algo["preset"] in ALGO_PRESETS:
        return {**ALGO_PRESETS[algo["preset"]], **algo}  # an unknown name is left to the field's own error
    return algo


# --------------------------------------------------------------------------------------------
# training


class SftConfig(Section):
    mode: Literal["lora", "full"] = Field(
        "lora",
        description="`lora`: train an adapter; `full`: train every weight and write a whole model (merged weights) "
        "that GRPO "
        "can start from.",
    )
    episodes: int = Field(512, ge=1, description="Oracle transcripts generated for behaviour cloning.")
    epochs: int = Field(2, ge=1, description="Passes over the transcripts.")
    lr: float = Field(2e-3, gt=0, description="Learning rate of the SFT warm start.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="`constant`, `linear` or `cosine` decay to 0 after the warm-up; with `max_minutes` the decay "
        "follows "
        "whichever of steps and time is further along, so a run the budget ends has decayed by then. A random "
        "tiny model learns to read its images in a sudden drop of the loss after a plateau, which an early decay "
        "can prevent (the maze, batches of 16, linear decay: it never got there; bench/RESULTS.md).",
    )
    batch_size: int = Field(16, ge=1, description="Transcripts per optimizer step.")
    target_loss: float | None = Field(
        None,
        gt=0,
        description="Stop early once the mean loss of the last 20 steps is below this (None: run every step). The "
        "demo uses "
        "it to end the warm start at the same competence whatever the batch order.",
    )
    noise: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of oracle turns replaced by a random response (the env's `random_response`, e.g. a random "
        "move in "
        "the maze), so transcripts show recovery.",
    )
    warmup_steps: int = Field(
        0, ge=0, description="Linear learning-rate warm-up over this many SFT steps (then `lr_schedule`)."
    )
    data_workers: int = Field(
        0,
        ge=0,
        description="Processes that play and tokenize oracle transcripts while the model trains (0: all transcripts "
        "are built "
        "up front in this process). On a GPU the transcripts, not the model, are the bottleneck without them.",
    )
    max_minutes: float | None = Field(
        None,
        gt=0,
        description="Wall-clock budget of the SFT loop: past it the model trained so far is saved and SFT ends (None: "
        "no "
        "limit). For jobs with a time slot.",
    )


class VisionPretrainConfig(Section):
    steps: int = Field(
        1000,
        ge=1,
        description="Optimizer steps of `vlrl model pretrain-vision` (dense perception labels on the vision tower).",
    )
    max_minutes: float | None = Field(
        None, gt=0, description="Wall-clock budget: past it the tower trained so far is saved (None: run every step)."
    )
    batch_size: int = Field(64, ge=1, description="Images per step; each gives one example per maze square.")
    lr: float = Field(1e-3, gt=0, description="Learning rate (AdamW) of the vision tower and its temporary head.")
    warmup_steps: int = Field(50, ge=0, description="Linear learning-rate warm-up, then constant.")
    tasks: int = Field(
        4096, ge=1, description="Training images: tasks of the train split, the agent anywhere (maze_look placement)."
    )
    eval_tasks: int = Field(200, ge=1, description="Holdout images the perception scores are measured on.")
    eval_every: int = Field(100, ge=1, description="Steps between two measurements on the holdout images.")


GuardAction = Literal["warn", "skip", "rollback", "stop"]
_GUARD_ACTION_DOC = (
    "What happens when the check fires: `warn` logs it (the update stays as computed); `skip` drops the step's "
    "update (adapter, optimizer and LR schedule as before it); `rollback` restores the newest valid checkpoint and "
    "multiplies the learning rate by train.guards.rollback_lr_factor; `stop` writes a checkpoint and ends the run "
    "with an error line naming the check and its values."
)


class NonFiniteGuard(Section):
    enabled: bool = Field(
        True,
        description="Fire when the step's reward/mean, train/loss, train/grad_norm, train/kl or train/entropy is NaN "
        "or "
        "infinite. "
        "On unless disabled: a non-finite gradient is then never applied (unless the action is `warn`), so the "
        "adapter stays finite.",
    )
    action: GuardAction = Field("stop", description=_GUARD_ACTION_DOC)


class KlGuard(Section):
    enabled: bool = Field(
        False, description="Fire when train/kl (k3 KL to the reference; needs algo.kl_coef > 0) exceeds `bound`."
    )
    bound: float = Field(0.5, gt=0, description="Largest acceptable train/kl (> 0).")
    action: GuardAction = Field("stop", description=_GUARD_ACTION_DOC)


class EntropyGuard(Section):
    enabled: bool = Field(
        False, description="Fire when train/entropy (mean token entropy) falls below `bound` (entropy collapse)."
    )
    bound: float = Field(0.05, gt=0, description="Smallest acceptable train/entropy in nats (> 0).")
    action: GuardAction = Field("stop", description=_GUARD_ACTION_DOC)


class GradSpikeGuard(Section):
    enabled: bool = Field(
        False,
        description="Fire when train/grad_norm (before clipping) exceeds `factor` times the median of the last "
        "`window` "
        "steps' norms.",
    )
    factor: float = Field(10.0, gt=1, description="How many times the running median counts as a spike (> 1).")
    window: int = Field(20, ge=1, description="Steps in the running median (steps with a guard event are left out).")
    min_steps: int = Field(5, ge=1, description="Steps of history needed before a spike can be judged.")
    action: GuardAction = Field("skip", description=_GUARD_ACTION_DOC)


class RewardHackingGuard(Section):
    enabled: bool = Field(
        False,
        description="At each periodic holdout evaluation (train.eval_every): fire when holdout success fell at least "
        "`min_success_drop` "
        "below the best evaluation so far while the mean train reward of the last `reward_window` steps rose more than "
        "`min_reward_gain` above its mean at that best evaluation.",
    )
    min_success_drop: float = Field(
        0.1, gt=0, le=1, description="Drop of holdout success from its best (0.1 = 10 points) that counts."
    )
    min_reward_gain: float = Field(
        0.0, ge=0, description="Train reward must have risen by more than this since the best evaluation."
    )
    reward_window: int = Field(
        5, ge=1, description="Steps over which train reward is averaged, at the best evaluation and now."
    )
    action: Literal["warn", "rollback", "stop"] = Field(
        "stop",
        description="As for the other checks, without `skip` (reward hacking is a trend over evaluations, not one "
        "update).",
    )


class GuardsConfig(Section):
    nonfinite: NonFiniteGuard = Field(
        default_factory=NonFiniteGuard, description="Non-finite loss, gradients, KL, entropy or reward."
    )
    kl_max: KlGuard = Field(default_factory=KlGuard, description="KL to the reference above a bound.")
    entropy_min: EntropyGuard = Field(default_factory=EntropyGuard, description="Token entropy below a floor.")
    grad_spike: GradSpikeGuard = Field(
        default_factory=GradSpikeGuard, description="Gradient-norm spike against a running median."
    )
    reward_hacking: RewardHackingGuard = Field(
        default_factory=RewardHackingGuard, description="Train reward up while holdout success falls."
    )
    rollback_lr_factor: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="`rollback` multiplies the learning rate by this (0 < factor < 1); kept in checkpoints, so it "
        "survives "
        "resumes.",
    )
    max_rollbacks: int = Field(
        3,
        ge=0,
        description="Rollbacks allowed over the run; a guard that would roll back once more stops the run instead.",
    )


class TrainConfig(Section):
    seed: int = Field(0, description="Seed of everything: Python, NumPy, torch, the task sampler, the environments.")
    steps: int = Field(20, ge=1, description="GRPO steps.")
    lr: float = Field(1e-4, gt=0, description="Peak learning rate of the LoRA parameters (AdamW).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up, in optimizer steps.")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="Schedule after warm-up.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each transformer block's activations in backward instead of keeping them "
        "(non-reentrant torch "
        "checkpoint): far less memory for long multi-turn sequences, about one more forward of time.",
    )
    max_minutes: float | None = Field(
        None,
        gt=0,
        description="Wall-clock budget of this command: when the next step would end past it (judged by the longest "
        "of the "
        "last three steps), the run checkpoints and stops with exit status 75 (EX_TEMPFAIL); the same command "
        "with `--resume auto` continues it. None: no limit. For time-boxed jobs and preemptible slots.",
    )
    eval_every: int = Field(0, ge=0, description="Evaluate on the holdout split every N steps (0: only at the end).")
    eval_tasks: int = Field(64, ge=1, description="Holdout tasks used by periodic evaluation.")
    checkpoint_every: int = Field(
        0,
        ge=0,
        description="Write a checkpoint every N steps and at the end (0: only at the end); a resume or a worker "
        "restart loses "
        "at most N steps.",
    )
    keep_checkpoints: int = Field(
        2, ge=1, description="Checkpoints kept (the newest by step); the newest valid one is never deleted."
    )
    sft: SftConfig = Field(default_factory=SftConfig, description="Settings of the SFT warm start (`vlrl sft`).")
    vision_pretrain: VisionPretrainConfig = Field(
        default_factory=VisionPretrainConfig,
        description="Perception pretraining of a tiny model's vision tower (`vlrl model pretrain-vision`, before SFT).",
    )
    guards: GuardsConfig = Field(
        default_factory=GuardsConfig,
        description="Stability guards: checks on each step's record and what to do when one fires "
        "(docs/observability.md).",
    )


# --------------------------------------------------------------------------------------------
# runtime, storage, tracking, serving


class RuntimeConfig(Section):
    backend: Literal["ray", "local"] = Field(
        "ray",
        description=(
            "`ray`: workers are Ray actors in a placement group (a local Ray instance is started when no "
            "address is given); `local`: one in-process worker, no Ray (unit tests, notebooks)."
        ),
    )
    address: str | None = Field(
        None,
        description="Ray cluster to join (host:port of the GCS, ray://host:10001, or auto); None: RAY_ADDRESS, else a "
        "local "
        "instance.",
    )
    num_workers: int = Field(
        1,
        ge=1,
        description="Worker actors, one per device (GPU, or CPU slot without GPUs); >1 shards the policy with FSDP2.",
    )
    use_gpu: bool = Field(False, description="One GPU per worker; False runs workers on CPU slots.")
    cpus_per_worker: int = Field(1, ge=1, description="CPU cores reserved for each worker.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement group strategy; STRICT_SPREAD puts each worker on its own node."
    )
    placement_timeout_s: float = Field(
        120.0, gt=0, description="Give up with an error if the placement group is not ready by then."
    )
    collective_timeout_s: float = Field(
        600.0,
        gt=0,
        description="torch.distributed timeout: a collective waiting longer (a dead peer) fails instead of hanging.",
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads per worker (None: torch's default; Ray sets cpus_per_worker)."
    )
    object_store_memory_mb: int = Field(300, ge=64, description="Object store of a local Ray instance, in MiB.")
    max_restarts: int = Field(
        3,
        ge=0,
        description=(
            "When a worker actor dies (its process or node lost), rebuild the worker group, reload the last checkpoint "
            "and continue, at most this many times per `vlrl train` process (0: the run fails at the first death). "
            "Each restart is logged and counted in the metric `run/restarts`."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> RuntimeConfig:
        if self.backend == "local" and self.num_workers > 1:
            raise ValueError(
                f"num_workers = {self.num_workers} needs backend 'ray' (the local backend runs one in-process worker)"
            )
        return self


class StorageConfig(Section):
    root: str = Field(
        "runs", description="Shared storage: a POSIX path (e.g. /fsx) or fsspec URL for runs and artifacts."
    )
    run_name: str | None = Field(None, description="Run directory name under root/ (default: a timestamp).")


class TrackingConfig(Section):
    enabled: bool = Field(False, description="Log to MLflow.")
    uri: str | None = Field(
        None,
        description="MLflow tracking URI (e.g. http://mlflow:5000 for a server); None uses SQLite at "
        "<storage.root>/mlflow.db.",
    )
    experiment: str = Field("vlrl", description="MLflow experiment name.")
    log_artifacts: bool = Field(
        True,
        description="At the end of a tracked run, copy the adapter, lineage, config and metrics into MLflow's "
        "artifact store.",
    )
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Ray's metrics export port on every node (`ray start --metrics-export-port`); the cluster "
        "manifests declare it and the PodMonitor scrapes it. vlrl's own training metrics use exporter_port.",
    )
    exporter_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve the run's training metrics (vlrl_*, docs/observability.md) for Prometheus on this port "
        "of the driver; 0 picks a free port, None turns the exporter off. Must differ from metrics_port: "
        "on a Ray head the driver and Ray's metrics agent share the pod.",
    )
    exporter_host: str = Field(
        "127.0.0.1",
        description="Address the exporter binds: 127.0.0.1 on a workstation, 0.0.0.0 in a pod that Prometheus scrapes.",
    )


class RegistryConfig(Section):
    uri: str | None = Field(
        None,
        description="MLflow model registry URI (or a path to a .db file); None uses the tracking store (tracking.uri, "
        "else "
        "<storage.root>/mlflow.db).",
    )
    model_name: str = Field(
        "{env}-{base}",
        description="Registered model name, one per task and base model: {env} is env.name, {base} the first 12 hex "
        "digits of "
        "the base fingerprint.",
    )
    holdout_margin: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Promotion gate: holdout success must beat production (or the base model) by at least this much "
        "(0.02 = 2 "
        "points), and pass the paired test (registry.max_p_value).",
    )
    max_p_value: float = Field(
        0.05,
        gt=0,
        le=1,
        description="Promotion gate: McNemar's exact two-sided p-value on the holdout tasks only one of candidate and "
        "production (or the base model) solved must be below this, with the candidate solving more of them.",
    )
    max_adversarial_drop: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Promotion gate: adversarial success may fall at most this much below production (or the base "
        "model).",
    )
    decoding: Literal["greedy", "sampled"] = Field(
        "greedy", description="Which decoding's evaluation summaries the gate compares."
    )
    audit_log: str | None = Field(
        None,
        description="JSONL audit log of registrations, promotions and rollbacks; None: registry-audit.jsonl next to "
        "the "
        "SQLite DB (or under storage.root).",
    )
    lock_timeout_s: float = Field(
        5.0, gt=0, description="How long to wait for a locked SQLite registry before giving up with an error."
    )
    access_dir: str | None = Field(
        None,
        description="Identities and roles (docs/security.md): a directory of NAME.sha256 digests (or NAME.token "
        "files) and "
        "roles.yaml. When set, register needs the role trainer, "
        "promote and rollback approver, and the acting identity is the one whose token is in --identity-file (or "
        "$VLRL_IDENTITY_FILE); "
        "None: no roles, anyone who can write the registry acts (the audit log records the OS user).",
    )
    two_person_rule: bool = Field(
        False,
        description="Promotion to production needs an identity other than the one that registered the version (needs "
        "access_dir). "
        "Off for local use; on in the cluster config.",
    )

    @model_validator(mode="after")
    def _check(self) -> RegistryConfig:
        if self.two_person_rule and not self.access_dir:
            raise ValueError(
                "registry.two_person_rule needs registry.access_dir: without identities there is no second person "
                "to tell apart"
            )
        return self


class ServingConfig(Section):
    host: str = Field("127.0.0.1", description="Address the OpenAI-compatible server binds.")
    port: int = Field(8000, ge=1, le=65535, description="Port of the server.")
    max_model_len: int = Field(4096, ge=64, description="Longest request in tokens.")
    max_loras: int = Field(4, ge=1, description="Adapters resident at once.")
    max_lora_rank: int | None = Field(
        None,
        ge=1,
        description="Largest LoRA rank a (later swapped-in) adapter may have; None: the smallest vLLM rank that fits "
        "the "
        "adapters served at start.",
    )
    kv_cache_mb: int | None = Field(
        None,
        ge=16,
        description="KV cache size in MiB (vLLM's --kv-cache-memory-bytes); None: vLLM's default on GPU, 256 on CPU, "
        "where it "
        "must be set.",
    )
    max_images: int = Field(
        20,
        ge=1,
        description="Images per request; a multi-turn conversation re-sends every turn's image (up to env.max_turns "
        "of them).",
    )
    ready_timeout_s: float = Field(
        900.0, gt=0, description="Give up when the server is not ready (all adapters loaded) by then."
    )


class RunConfig(Section):
    """A whole run. Each section is documented field by field."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Base model and LoRA.")
    env: SerializeAsAny[EnvConfigBase] = Field(
        default_factory=default_env_config,
        description="Environment and its splits; `env.name` selects the registered env whose config class validates "
        "the "
        "section.",
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout engine and sampling.")
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="GRPO and its variants.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation, evaluation and checkpoints.")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, description="Ray workers and placement.")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Where runs are written.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow and metrics.")
    serving: ServingConfig = Field(default_factory=ServingConfig, description="Adapter serving.")
    registry: RegistryConfig = Field(
        default_factory=RegistryConfig, description="Adapter registry and its promotion gate."
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_by_name(cls, value: Any) -> Any:
        return env_config(value)

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.algo.mini_batch_size % self.algo.micro_batch_size:
            raise ValueError(
                f"algo.mini_batch_size ({self.algo.mini_batch_size}) must be a multiple of "
                f"algo.micro_batch_size ({self.algo.micro_batch_size})"
            )
        if self.algo.step_advantage_weight > 0 and self.algo.ratio_level == "sequence":
            raise ValueError(
                "algo.step_advantage_weight > 0 (per-turn advantages) needs algo.ratio_level 'token', not "
                "'sequence' (GSPO)"
            )
        return self


# --------------------------------------------------------------------------------------------
# loading


def _section_class(ann: Any, data: Any) -> type[BaseModel] | None:
    """The model class a field of annotation `ann` validates `data` with; None for a leaf.

    The env section is validated by the config class of the env its data names."""
    if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
        return None
    if ann is EnvConfigBase:
        name = data.get("name", DEFAULT_ENV) if isinstance(data, dict) else DEFAULT_ENV
        try:
            return env_config_class(str(name))
        except VlrlError:
            return ann
    return ann


def _section_at(path: tuple[str, ...], data: Any) -> type[BaseModel] | None:
    """The pydantic model class at a dotted path of RunConfig, or None past a leaf."""
    cls: type[BaseModel] | None = RunConfig
    for part in path:
        field = cls.model_fields.get(part)
        if field is None:
            return None
        data = data.get(part) if isinstance(data, dict) else None
        cls = _section_class(field.annotation, data)
        if cls is None:
            return None
    return cls


def _explain(err: dict[str, Any], source: str, data: dict[str, Any]) -> str:
    loc = tuple(str(p) for p in err["loc"])
    key = ".".join(loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        section = _section_at(loc[:-1], data)
        known = list(section.model_fields) if section else []
        close = closest(loc[-1], known)
        hint = (
            f"; did you mean '{'.'.join(loc[:-1] + (close,))}'?"
            if close
            else (f"; known keys: {', '.join(known)}" if known else "")
        )
        return f"{source}: unknown key '{key}'{hint}"
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    if isinstance(value, dict):
        return f"{source}: {key}: {msg}"
    return f"{source}: {key} = {value!r}: {msg}"


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`update` laid over `base`, section by section, so a file may set only some fields of a section."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`algo.group_size=8` -> ("algo.group_size", 8); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key.sub=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _defaults(data: dict[str, Any]) -> dict[str, Any]:
    """The default RunConfig as a dict, its env section that of the env `data` names."""
    defaults = RunConfig().model_dump()
    env = data.get("env")
    name = env.get("name", DEFAULT_ENV) if isinstance(env, dict) else DEFAULT_ENV
    try:
        defaults["env"] = env_config_class(str(name))().model_dump()
    except VlrlError:  # an unknown name: validation reports it with a did-you-mean
        defaults["env"] = {}
    return defaults


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a RunConfig from YAML (or defaults when path is None) and apply dotted overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"{p}:{where} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections (model:, env:, ...)")
        data = loaded
    for text in overrides or []:
        key, value = parse_override(text)
        _set_dotted(data, key, value)
    if overrides:
        source += " (with overrides)"
    if isinstance(data.get("algo"), dict):
        data["algo"] = apply_algo_preset(data["algo"])
    merged = _deep_merge(_defaults(data), data)
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        errors = exc.errors()
        first = _explain(errors[0], source, merged)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(first + more) from None


def config_to_yaml(config: RunConfig) -> str:
    """The fully resolved config as YAML, every field included."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def describe_fields(
    cls: type[BaseModel] = RunConfig, prefix: str = "", env: str = DEFAULT_ENV
) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every leaf field, for `vlrl config show --doc`.

    The `env.*` rows are the fields of the config class of the env named `env`."""
    rows: list[tuple[str, str, str, str]] = []
    for name, field in cls.model_fields.items():
        ann = field.annotation
        key = f"{prefix}{name}"
        section = _section_class(ann, {"name": env})
        if section is not None:
            rows.extend(describe_fields(section, key + ".", env))
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        type_name = ann.__name__ if isinstance(ann, type) else str(ann).replace("typing.", "")
        rows.append((key, type_name, repr(default), field.description or ""))
    return rows
