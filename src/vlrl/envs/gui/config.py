"""`GuiEnvConfig`: the `env` section of a run that plays the `gui` env (docs/gui.md)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from vlrl.envs.config import EnvConfigBase
from vlrl.envs.gui.generate import LEVELS, MIN_SIZE
from vlrl.envs.gui.render import THEMES
from vlrl.sections import Section

MAX_SIDE = 448  # 28 x 28 image tokens at 16 px each; the tiny models' processor downscales above 224 x 224
MAX_DISTRACTORS = 10


def _check_side(value: int, what: str) -> int:
    if value % 16 or not 48 <= value <= MAX_SIDE:
        raise ValueError(
            f"{what} must be a multiple of 16 from 48 to {MAX_SIDE} (the 16-px grid of one image token), got {value}"
        )
    return value


class GuiRewardConfig(Section):
    success: float = Field(
        1.0, description="Terminal reward when the episode ends with the goal holding (the reference reward)."
    )
    subgoal: float = Field(
        0.0,
        ge=0,
        description=(
            "Shaping: reward per unit of subgoal potential gained (a goal field set right +1, another field changed "
            "-1, the goal holding +1); telescopes, so it cannot be farmed."
        ),
    )
    invalid_action: float = Field(
        0.0,
        le=0,
        description=(
            "Penalty (<= 0) for a turn whose action does not parse, clicks outside the screen, or types with no field "
            "focused."
        ),
    )
    misclick: float = Field(0.0, le=0, description="Penalty (<= 0) for a click inside the screen that hits no widget.")
    step_cost: float = Field(
        0.0, le=0, description="Cost (<= 0) added on every turn, to prefer short action sequences."
    )


class GuiAdversarialConfig(Section):
    themes: list[str] = Field(
        default_factory=lambda: ["dark", "contrast", "noise"],
        description="Colour themes of the adversarial split (training uses env.theme).",
    )
    sizes: list[int] = Field(
        default_factory=lambda: [192],
        description=(
            "Square screen sides (px, multiples of 16) of the adversarial split's other resolutions; apps are laid "
            "out for that size."
        ),
    )
    extra_distractors: int = Field(
        3, ge=0, le=MAX_DISTRACTORS, description="More distractor widgets than training's maximum, in one variant."
    )
    moved: bool = Field(True, description="A variant with every widget shifted off the 16-px grid (1-7 px).")

    @field_validator("themes")
    @classmethod
    def _known_themes(cls, themes: list[str]) -> list[str]:
        for theme in themes:
            if theme not in THEMES:
                raise ValueError(f"unknown gui theme {theme!r}; known: {', '.join(THEMES)}")
        return themes

    @field_validator("sizes")
    @classmethod
    def _sides(cls, sizes: list[int]) -> list[int]:
        return [_check_side(s, "adversarial_variants.sizes") for s in sizes]


class GuiEnvConfig(EnvConfigBase):
    resume_safe_keys: ClassVar[tuple[str, ...]] = ("adversarial", "adversarial_variants")  # evaluation only

    name: Literal["gui"] = Field(
        "gui", description="The GUI env: procedurally generated app screens, controlled by clicks and typing."
    )
    levels: list[int] = Field(
        default_factory=lambda: [1],
        description=(
            "Difficulty levels cycled over the tasks: 1 click the highlighted button, 2 set a toggle/checkbox by "
            "label then Save, 3 type into a labelled field then Save, 4 two changes on two tabs then Save."
        ),
    )
    width: int = Field(
        128, description="Screenshot width in pixels (multiple of 16; level minimums: 1: 48, 2-3: 128, 4: 160)."
    )
    height: int = Field(
        128, description="Screenshot height in pixels (multiple of 16; level minimums: 1: 48, 2-3: 96, 4: 128)."
    )
    distractors: tuple[int, int] = Field(
        (2, 4),
        description=(
            "The fewest and most widgets besides the targets, as (min, max) (level 1: other buttons; 2-4: other "
            "controls per screen; as many as fit)."
        ),
    )
    theme: str = Field("light", description=f"Colour theme of training and holdout screens: {', '.join(THEMES)}.")
    max_turns: int = Field(8, ge=1, le=64, description="Episode length limit in model turns.")
    stop_required: bool = Field(
        True,
        description=(
            "The episode succeeds only when the model answers `stop` with the goal holding; False ends it as soon as "
            "the goal holds."
        ),
    )
    rewards: GuiRewardConfig = Field(
        default_factory=GuiRewardConfig, description="Reward terms (src/vlrl/envs/gui/rewards.py)."
    )
    adversarial_variants: GuiAdversarialConfig = Field(
        default_factory=GuiAdversarialConfig,
        description="How adversarial tasks differ from training ones: themes, resolutions, more distractors, moved "
        "widgets.",
    )

    @field_validator("levels")
    @classmethod
    def _levels(cls, levels: list[int]) -> list[int]:
        if not levels:
            raise ValueError("levels must name at least one level")
        for level in levels:
            if level not in LEVELS:
                raise ValueError(f"unknown gui level {level}; levels are {', '.join(map(str, LEVELS))}")
        return levels

    @field_validator("width", "height")
    @classmethod
    def _side(cls, value: int, info) -> int:
        return _check_side(value, info.field_name)

    @field_validator("theme")
    @classmethod
    def _theme(cls, theme: str) -> str:
        if theme not in THEMES:
            raise ValueError(f"unknown gui theme {theme!r}; known: {', '.join(THEMES)}")
        return theme

    @model_validator(mode="after")
    def _check(self) -> GuiEnvConfig:
        lo, hi = self.distractors
        if not 0 <= lo <= hi <= MAX_DISTRACTORS:
            raise ValueError(
                f"distractors must be [min, max] with 0 <= min <= max <= {MAX_DISTRACTORS}, got [{lo}, {hi}]"
            )
        sides = [(self.width, self.height)] + [(s, s) for s in self.adversarial_variants.sizes]
        for level in self.levels:
            for w, h in sides:
                w_min, h_min = MIN_SIZE[level]
                if w < w_min or h < h_min:
                    raise ValueError(
                        f"a {w}x{h} screen is too small for level {level} (needs at least {w_min}x{h_min})"
                    )
        return self
