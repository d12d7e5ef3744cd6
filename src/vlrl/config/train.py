"""The optimisation side of a run's config: SFT warm start, vision pretraining, the stability guards,
and the GRPO loop's schedule, evaluation and checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vlrl.sections import Section

# training


class SftConfig(Section):
    mode: Literal["lora", "full"] = Field(
        "lora",
        description="`lora`: train an adapter; `full`: train every weight and write a whole model (merged weights) "
        "that GRPO can start from.",
    )
    episodes: int = Field(512, ge=1, description="Demonstrator transcripts generated for behaviour cloning.")
    demonstrator: Literal["oracle", "walker", "walker_random", "walker_blind"] = Field(
        "oracle",
        description="Who plays the SFT transcripts: `oracle` (the env's perfect policy; the maze: BFS), or an "
        "imperfect demonstrator, so that GRPO has something imitation cannot give: `walker` (the maze: a "
        "depth-first walk with a goal-facing preferred branch and backtracking, deterministic; "
        "src/vlrl/envs/maze/walker.py), `walker_random` (the same with a per-episode seeded order) or `walker_blind` "
        "(goal-blind: the fixed order up, right, down, left in every maze). Recorded in "
        "the lineage with its measured success on the SFT tasks.",
    )
    epochs: int = Field(2, ge=1, description="Passes over the transcripts.")
    lr: float = Field(2e-3, gt=0, description="Learning rate of the SFT warm start.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="`constant`, `linear` or `cosine` decay to 0 after the warm-up; with `max_minutes` the decay "
        "follows whichever of steps and time is further along, so a run the budget ends has decayed by then. A random "
        "tiny model learns to read its images in a sudden drop of the loss after a plateau, which an early decay "
        "can prevent (the maze, batches of 16, linear decay: it never got there; bench/RESULTS.md).",
    )
    batch_size: int = Field(16, ge=1, description="Transcripts per optimizer step.")
    target_loss: float | None = Field(
        None,
        gt=0,
        description="Stop early once the mean loss of the last 20 steps is below this (None: run every step). The "
        "demo uses it to end the warm start at the same competence whatever the batch order.",
    )
    noise: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of oracle turns replaced by a random response (the env's `random_response`, e.g. a random "
        "move in the maze), so transcripts show recovery.",
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
        "no limit). For jobs with a time slot.",
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
    in_demo: bool = Field(
        False,
        description="`vlrl demo`: pretrain the built model's vision tower with these settings before the SFT warm "
        "start, so SFT and GRPO start from a model that already sees the maze (the demo's `base` row is then it).",
    )


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
        "or infinite. "
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
        "`window` steps' norms.",
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
        "survives resumes.",
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
    compile_blocks: bool | Literal["auto"] = Field(
        "auto",
        description="torch.compile each transformer block's forward for the update (regional compilation, "
        "vlrl.models.regional_compile): the elementwise work around the matmuls is fused, which makes the update "
        "faster and its peak memory lower on GPU. `auto`: on where the policy is on CUDA and has at least 1B "
        "parameters; off on CPU (where compiling needs a C++ compiler) and for smaller models, whose updates are too "
        "short to win back the compile's tens of seconds. The first update pays the compile (one "
        "graph shared by all blocks of a kind) and a new sequence shape may recompile; rollouts and evaluation "
        "stay eager.",
    )
    max_minutes: float | None = Field(
        None,
        gt=0,
        description="Wall-clock budget of this command: when the next step would end past it (judged by the longest "
        "of the last three steps), the run checkpoints and stops with exit status 75 (EX_TEMPFAIL); the same command "
        "with `--resume auto` continues it. None: no limit. For time-boxed jobs and preemptible slots.",
    )
    on_time_limit: Literal["pause", "finish"] = Field(
        "pause",
        description="What `max_minutes` does when it runs out: `pause` (checkpoint, exit 75, resumable) or `finish` "
        "(end the run there as if `steps` were reached: final evaluation, checkpoint, adapter, exit 0), for arms "
        "compared at equal wall-clock time. The learning-rate schedule still runs over `steps`, so a `finish` arm "
        "with a decaying schedule ends before its decay does.",
    )
    eval_every: int = Field(0, ge=0, description="Evaluate on the holdout split every N steps (0: only at the end).")
    eval_tasks: int = Field(64, ge=1, description="Holdout tasks used by periodic evaluation.")
    checkpoint_every: int = Field(
        0,
        ge=0,
        description="Write a checkpoint every N steps and at the end (0: only at the end); a resume or a worker "
        "restart loses at most N steps.",
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
