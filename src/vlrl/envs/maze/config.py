"""The maze's config: sizes, layout, drawing, placement, rewards, adversarial variants.

`MazeEnvConfig` validates `RunConfig.env` when `env.name` is `maze`, `maze_plan` or an env
registered from a subclass of theirs (they inherit the config class).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from vlrl.envs.config import EnvConfigBase, SplitConfig
from vlrl.sections import Section


class RewardConfig(Section):
    success: float = Field(1.0, description="Terminal reward when the episode ends on the goal (the reference reward).")
    progress: float = Field(
        0.0,
        ge=0,
        description="Shaping: reward per cell of BFS distance gained towards the goal (negative when moving away).",
    )
    invalid_action: float = Field(
        0.0, le=0, description="Penalty (<= 0) for a turn whose output has no parseable action."
    )
    wall_bump: float = Field(0.0, le=0, description="Penalty (<= 0) for trying to move into a wall.")
    step_cost: float = Field(0.0, le=0, description="Cost (<= 0) added on every turn, to prefer short paths.")


class MazeSplitConfig(SplitConfig):
    sizes: list[int] | None = Field(None, description="Maze sizes of this split (default: env.sizes).")


class AdversarialConfig(Section):
    themes: list[str] = Field(
        default_factory=lambda: ["dark", "pastel", "noise"], description="Colour themes used by the adversarial split."
    )
    transforms: list[Literal["mirror", "rotate90", "rotate180", "rotate270"]] = Field(
        default_factory=lambda: ["mirror", "rotate90", "rotate180", "rotate270"],
        description="Geometric transforms of the maze (the action meanings stay those of the image).",
    )
    extra_sizes: list[int] = Field(
        default_factory=list, description="Sizes larger than trained on, added to the split."
    )


class MazeEnvConfig(EnvConfigBase):
    resume_safe_keys: ClassVar[tuple[str, ...]] = ("adversarial", "adversarial_variants")

    name: str = Field(
        "maze",
        description=(
            "`maze` (multi-turn, one action per turn), `maze_plan` (single turn, whole path), or an env registered "
            "from a subclass of theirs."
        ),
    )
    sizes: list[int] = Field(default_factory=lambda: [5], description="Maze sizes N (NxN cells) sampled for training.")
    layout: Literal["cells", "blocks"] = Field(
        "cells",
        description=(
            "Maze drawing and movement. `cells`: N x N cells with thin wall lines on cell borders. "
            "`blocks`: the reference layout (SkyRL VisGym maze): N x N square blocks where walls are whole gray "
            "blocks, the (N-1)/2 x (N-1)/2 rooms sit at odd coordinates and a move goes one block "
            "(9 -> 4x4 rooms, 11 -> 5x5); every size (env, split and adversarial extra sizes) must then be odd "
            "and >= 5, and cell_px is pixels per block."
        ),
    )
    cell_px: int = Field(25, ge=4, le=128, description="Pixels per cell; 25 reproduces the reference (9x9 -> 225 px).")
    placement: Literal["corners", "random"] = Field(
        "corners", description="Start and goal at opposite corners (reference) or random cells."
    )
    min_distance: int = Field(2, ge=1, description="With random placement: minimum BFS distance from start to goal.")
    max_turns: int = Field(18, ge=1, le=256, description="Episode length limit in model turns (reference: 18).")
    stop_required: bool = Field(
        True,
        description="The episode succeeds only when the agent says `stop` on the goal (reference); False ends it on "
        "arrival.",
    )
    end_when_lost: bool = Field(
        False,
        description=(
            "Multi-turn maze: end the episode, without success, on the turn after which the goal can no longer be "
            "reached (and stopped on) in the turns left. With a success-only reward nothing the agent does after that "
            "turn can change the return, so those turns are only rollout time and gradient noise for GRPO (24-27% of "
            "the reference task's greedy turns: bench/RESULTS.md). Success is the same as without it; with shaping "
            "terms (progress, bumps, invalid, step cost) the return of a lost episode leaves out the turns not played."
        ),
    )
    rewards: RewardConfig = Field(default_factory=RewardConfig, description="Reward terms.")
    train: MazeSplitConfig = Field(
        default_factory=lambda: MazeSplitConfig(seed_start=0, count=100_000), description="Training tasks."
    )
    holdout: MazeSplitConfig = Field(
        default_factory=lambda: MazeSplitConfig(seed_start=10_000_000, count=200),
        description="Held-out evaluation tasks.",
    )
    adversarial: MazeSplitConfig = Field(
        default_factory=lambda: MazeSplitConfig(seed_start=20_000_000, count=200),
        description="Adversarial evaluation tasks.",
    )
    adversarial_variants: AdversarialConfig = Field(
        default_factory=AdversarialConfig, description="How adversarial tasks differ from training ones."
    )

    @model_validator(mode="after")
    def _check_sizes(self) -> MazeEnvConfig:
        for n in self.sizes:
            if not 3 <= n <= 64:
                raise ValueError(f"maze size {n} is out of range: sizes must be between 3 and 64")
        if self.layout == "blocks":
            where = {"sizes": self.sizes, "adversarial_variants.extra_sizes": self.adversarial_variants.extra_sizes}
            where.update({f"{s}.sizes": getattr(self, s).sizes or [] for s in ("train", "holdout", "adversarial")})
            for key, sizes in where.items():
                bad = [n for n in sizes if n < 5 or n % 2 == 0]
                if bad:
                    raise ValueError(
                        f"layout 'blocks' needs odd maze sizes >= 5 (N x N blocks around (N-1)/2 x (N-1)/2 rooms), "
                        f"but env.{key} has {bad[0]}; use e.g. 9 or 11, or layout 'cells'"
                    )
        return self
