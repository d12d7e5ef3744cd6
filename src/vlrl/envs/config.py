"""What every env config has: a name, a turn limit and three disjoint seed ranges.

Each env package declares its own config class, derived from `EnvConfigBase`, and registers it
with the env class (`@register_env("gui", config=GuiEnvConfig)`). `RunConfig.env` is validated by
the class registered under its `name`, so `vlrl.config` knows no env's fields and a new env
needs no edit outside its package. A config class must build from its defaults alone
(`GuiEnvConfig()`): a YAML file's `env:` section is laid over them.

This module imports nothing from `vlrl.config` (which imports it).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from vlrl.sections import Section

SPLITS = ("train", "holdout", "adversarial")


class SplitConfig(Section):
    seed_start: int = Field(..., ge=0, description="First seed of the split; seed ranges of splits never overlap.")
    count: int = Field(..., ge=1, description="Number of tasks in the split.")


class EnvConfigBase(Section):
    """Fields every env has; subclasses add theirs (and may narrow `name` and the split type)."""

    # Keys of this section a resumed run may change (they do not change what a checkpoint means):
    # the adversarial split is evaluation only. A subclass adds its own evaluation-only keys.
    resume_safe_keys: ClassVar[tuple[str, ...]] = ("adversarial",)

    name: str = Field(
        ...,
        description=(
            "Registered environment; selects the config class that validates this section (`vlrl config show --doc "
            "--env NAME` lists its fields)."
        ),
    )
    max_turns: int = Field(18, ge=1, le=256, description="Episode length limit in model turns.")
    train: SplitConfig = Field(
        default_factory=lambda: SplitConfig(seed_start=0, count=100_000), description="Training tasks."
    )
    holdout: SplitConfig = Field(
        default_factory=lambda: SplitConfig(seed_start=10_000_000, count=200), description="Held-out evaluation tasks."
    )
    adversarial: SplitConfig = Field(
        default_factory=lambda: SplitConfig(seed_start=20_000_000, count=200),
        description="Adversarial evaluation tasks.",
    )

    @model_validator(mode="after")
    def _check_seed_ranges(self) -> EnvConfigBase:
        ranges = {
            s: (getattr(self, s).seed_start, getattr(self, s).seed_start + getattr(self, s).count) for s in SPLITS
        }
        for i, a in enumerate(SPLITS):
            for b in SPLITS[i + 1 :]:
                (a0, a1), (b0, b1) = ranges[a], ranges[b]
                if a0 < b1 and b0 < a1:
                    raise ValueError(f"seed ranges of splits {a} [{a0},{a1}) and {b} [{b0},{b1}) overlap")
        return self
