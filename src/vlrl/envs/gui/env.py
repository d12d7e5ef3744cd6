"""The GUI env (`gui`): control a procedurally generated app from its screenshots.

Each turn the model sees a screenshot of the shown screen and answers one action inside
`<action>...</action>` (the LAST tag counts): `click(x, y)` in pixels of the screenshot (the first
turn's text says its size, e.g. "The screen is 128x128 pixels."), `type("text")` into the focused
text field, or `stop`. The app's state machine (`app.py`) applies it and the next screenshot
shows the result; the turn's feedback text says what happened ('Turned on "Wi-Fi".', 'Clicked
(3, 90): nothing there.'), because a click that changes nothing leaves the picture unchanged.

Invalid turns change nothing: a response that does not parse (feedback INVALID_FEEDBACK), a click
outside the screen (OUTSIDE_FEEDBACK) and `type` with no text field focused (NO_FOCUS_FEEDBACK).
`stop` ends the episode, a success iff the goal holds (`app.goal_holds`: verified from the app's
state, e.g. the SAVED values equal the target ones). With `stop_required=False` the episode ends
with success as soon as the goal holds. After `max_turns` turns it ends without success.

Every episode's `trace()` is JSON (format TRACE_FORMAT) that `replay_trace` re-checks from the
app JSON and the raw responses alone; docs/gui.md documents both formats.
"""

from __future__ import annotations

from typing import Any

from vlrl.envs.base import Env, Observation, StepResult, Task, register_env
from vlrl.envs.gui.actions import format_action, parse_action
from vlrl.envs.gui.app import (
    App,
    AppState,
    Widget,
    click,
    describe_screen,
    goal_holds,
    instruction,
    subgoal_potential,
    type_text,
)
from vlrl.envs.gui.config import GuiEnvConfig
from vlrl.envs.gui.generate import GENERATOR_VERSION
from vlrl.envs.gui.oracle import optimal_turns, plan
from vlrl.envs.gui.render import render
from vlrl.envs.gui.rewards import turn_reward
from vlrl.envs.gui.splits import SPLIT_RULE, Split, adhoc_task, app_for_task, gui_split_version, train_overlap
from vlrl.envs.replay import episode_trace, replay_env_trace
from vlrl.errors import VlrlError

TRACE_FORMAT = "vlrl.gui.trace/1"

# -- fixed texts (templates are filled with labels, coordinates and sizes) --------------------
SYSTEM_PROMPT = "You are using an app. Each turn you see a screenshot and answer with one action."
ACTION_CHOICES = (
    "Answer with <action>click(x, y)</action> (x, y in pixels from the top left), "
    '<action>type("text")</action> (into the focused text field) or <action>stop</action> when done.'
)
SCREEN_SIZE = "The screen is {width}x{height} pixels."
INVALID_FEEDBACK = f"Invalid action. {ACTION_CHOICES}"
OUTSIDE_FEEDBACK = "click({x}, {y}) is outside the {width}x{height} screen."
NO_FOCUS_FEEDBACK = "No text field is focused; click one first."
MISS_FEEDBACK = "Clicked ({x}, {y}): nothing there."
PRESS_FEEDBACK = "Pressed the button."
LABELLED_PRESS_FEEDBACK = 'Pressed "{label}".'
SAVE_FEEDBACK = 'Pressed "{label}": saved.'
CANCEL_FEEDBACK = 'Pressed "{label}": changes undone.'
FLIP_FEEDBACK = {
    ("toggle", True): 'Turned on "{label}".',
    ("toggle", False): 'Turned off "{label}".',
    ("checkbox", True): 'Checked "{label}".',
    ("checkbox", False): 'Unchecked "{label}".',
}
FOCUS_FEEDBACK = 'The "{label}" field is focused.'
TYPE_FEEDBACK = 'Typed "{text}" into "{label}".'
TAB_FEEDBACK = 'Opened the "{label}" tab.'
STOP_DONE_FEEDBACK = "Stopped: the task is done."
STOP_NOT_DONE_FEEDBACK = "Stopped, but the task is not done."
DONE_FEEDBACK = "The task is done."
OUT_OF_TURNS_FEEDBACK = "Out of turns."

PROMPT_TEXTS: list[str] = [
    SYSTEM_PROMPT,
    ACTION_CHOICES,
    SCREEN_SIZE,
    INVALID_FEEDBACK,
    OUTSIDE_FEEDBACK,
    NO_FOCUS_FEEDBACK,
    MISS_FEEDBACK,
    PRESS_FEEDBACK,
    LABELLED_PRESS_FEEDBACK,
    SAVE_FEEDBACK,
    CANCEL_FEEDBACK,
    *FLIP_FEEDBACK.values(),
    FOCUS_FEEDBACK,
    TYPE_FEEDBACK,
    TAB_FEEDBACK,
    STOP_DONE_FEEDBACK,
    STOP_NOT_DONE_FEEDBACK,
    DONE_FEEDBACK,
    OUT_OF_TURNS_FEEDBACK,
]


def _effect_feedback(state: AppState, widget: Widget, effect: str) -> str:
    """The feedback text of a click on `widget` whose effect was `effect` (state after the click)."""
    label = widget.label
    if effect == "flip":
        return FLIP_FEEDBACK[(widget.kind, bool(state.values[widget.id]))].format(label=label)
    if effect == "focus":
        return FOCUS_FEEDBACK.format(label=label)
    if effect == "tab":
        return TAB_FEEDBACK.format(label=label)
    if effect == "save":
        return SAVE_FEEDBACK.format(label=label)
    if effect == "cancel":
        return CANCEL_FEEDBACK.format(label=label)
    return LABELLED_PRESS_FEEDBACK.format(label=label) if label else PRESS_FEEDBACK


@register_env("gui", config=GuiEnvConfig)
class GuiEnv(Env):
    """Multi-turn GUI control: one action per turn, a new screenshot each turn."""

    system_prompt = SYSTEM_PROMPT
    task_group_label = "level"  # evaluation tables have one row per level
    generator_version = GENERATOR_VERSION  # recorded in the run's data lineage

    def __init__(self, config: GuiEnvConfig, *, render_images: bool = True):
        self.config = config
        self.render_images = render_images
        self.task: Task | None = None
        self.app: App | None = None

    # -- split hooks used by vlrl.envs.base ---------------------------------------------------
    @classmethod
    def build_split(cls, config: GuiEnvConfig, split: str) -> Split:
        return Split(config, split)

    @classmethod
    def split_version(cls, config: GuiEnvConfig, split: str) -> str:
        return gui_split_version(config, split)

    @classmethod
    def content_hash(cls, task: Task) -> str:
        return app_for_task(task).content_hash()

    @classmethod
    def train_overlap(cls, config: GuiEnvConfig, tasks: list[Task]) -> list[Task]:
        return train_overlap(tasks)

    @classmethod
    def task_group(cls, task: Task) -> str:
        """Row label of per-group evaluation tables: the task's level."""
        return f"level {task.params.get('level')}"

    @classmethod
    def adhoc_task(cls, config: GuiEnvConfig, seed: int) -> Task:
        """A task outside any split: the app of `seed` at the config's first level, size and theme."""
        return adhoc_task(
            config.levels[0],
            seed,
            width=config.width,
            height=config.height,
            theme=config.theme,
            distractors=config.distractors,
        )

    @classmethod
    def describe_task(cls, task: Task) -> dict[str, str]:
        """Columns of `vlrl env split`: variant, size, screens, widgets, optimal turns (with stop)."""
        app = app_for_task(task)
        return {
            "variant": str(task.params.get("variant", "none")),
            "screen": f"{app.width}x{app.height}",
            "screens": str(len(app.screens)),
            "widgets": str(sum(len(s.widgets) for s in app.screens)),
            "optimal turns": str(optimal_turns(app)),
        }

    @classmethod
    def data_lineage(cls, config: GuiEnvConfig) -> dict[str, Any]:
        """The env's facts for the run's data lineage: split rule, levels, screen size, distractors."""
        return {
            "split_rule": SPLIT_RULE,
            "levels": list(config.levels),
            "screen": [config.width, config.height],
            "distractors": list(config.distractors),
            "theme": config.theme,
        }

    @classmethod
    def reward_spec(cls, config: GuiEnvConfig) -> dict[str, Any]:
        """What decides rewards and success: the reward terms, whether `stop` is required, the turn limit."""
        return {
            "rewards": config.rewards.model_dump(mode="json"),
            "stop_required": config.stop_required,
            "max_turns": config.max_turns,
        }

    # -- episode ------------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        """Start the episode of `task`: its app in its initial state."""
        return self.start(task, app_for_task(task))

    def start(self, task: Task, app: App) -> Observation:
        """Start an episode on an explicit app (used by `reset` and by trace replay)."""
        self.task, self.app = task, app
        self.state = AppState.initial(app)
        self.turns: list[dict[str, Any]] = []
        self.done = False
        self.success = False
        self.episode_return = 0.0
        self.invalid_actions = 0
        self.misclicks = 0
        self.optimal = optimal_turns(app, self.config.stop_required)
        text = f"{instruction(app)} {SCREEN_SIZE.format(width=app.width, height=app.height)} {ACTION_CHOICES}"
        return Observation(self._images(), text)

    def _images(self) -> list:
        return [self.screenshot()] if self.render_images else []

    def screenshot(self):
        """The current screenshot, in the task's theme (also when images are off for the episode)."""
        self._check_started("screenshot")
        theme = self.task.params.get("theme", "light")
        return render(self.app, self.state, theme, self.task.seed if theme == "noise" else None)

    def _check_started(self, what: str) -> None:
        if self.app is None:
            raise VlrlError(f"{what}() before reset(task); start an episode first")

    def step(self, action_text: str) -> StepResult:
        """Apply one response; see the module docstring for the rules."""
        self._check_started("step")
        if self.done:
            raise VlrlError("step() on a finished episode; call reset(task) to start a new one")
        cfg, app, state = self.config, self.app, self.state
        action = parse_action(action_text)
        before = subgoal_potential(app, state)
        invalid = misclick = False
        effect, widget_id = "invalid", None
        if action is None:
            feedback = INVALID_FEEDBACK
            invalid = True
        elif action.kind == "stop":
            effect = "stop"
            self.done = True
            self.success = goal_holds(app, state)
            feedback = STOP_DONE_FEEDBACK if self.success else STOP_NOT_DONE_FEEDBACK
        elif action.kind == "type":
            if type_text(state, action.text):
                effect, widget_id = "type", state.focus
                feedback = TYPE_FEEDBACK.format(text=action.text, label=app.widget(state.focus).label)
            else:
                effect, invalid = "no_focus", True
                feedback = NO_FOCUS_FEEDBACK
        elif not (0 <= action.x < app.width and 0 <= action.y < app.height):
            effect, invalid = "outside", True
            feedback = OUTSIDE_FEEDBACK.format(x=action.x, y=action.y, width=app.width, height=app.height)
        else:
            widget = app.screens[state.screen].hit(action.x, action.y)
            if widget is None:
                effect, misclick = "miss", True
                feedback = MISS_FEEDBACK.format(x=action.x, y=action.y)
            else:
                effect, widget_id = click(app, state, widget), widget.id
                feedback = _effect_feedback(state, widget, effect)
        self.invalid_actions += int(invalid)
        self.misclicks += int(misclick)
        if not self.done and not cfg.stop_required and goal_holds(app, state):
            self.done = self.success = True
            feedback = f"{feedback} {DONE_FEEDBACK}"
        truncated = not self.done and len(self.turns) + 1 >= cfg.max_turns
        if truncated:
            self.done = True
            feedback = f"{feedback} {OUT_OF_TURNS_FEEDBACK}"
        reward = turn_reward(
            cfg.rewards,
            invalid=invalid,
            misclick=misclick,
            potential_before=before,
            potential_after=subgoal_potential(app, state),
            success=self.success,
        )
        self.episode_return += reward
        self.turns.append(
            {
                "response": action_text,
                "action": None if action is None else format_action(action),
                "valid": not invalid,
                "effect": effect,
                "widget": widget_id,
                "reward": reward,
                "feedback": feedback,
                "screen": state.screen,
            }
        )
        info = {
            "action": self.turns[-1]["action"],
            "valid": not invalid,
            "effect": effect,
            "widget": widget_id,
            "success": self.success,
            "feedback": feedback,
            "turn": len(self.turns),
            "truncated": truncated,
        }
        observation = None if self.done else Observation(self._images(), feedback)
        return StepResult(observation, reward, self.done, info)

    def oracle_response(self) -> str:
        """`<action>...</action>` with the first action of a shortest plan from the current state."""
        self._check_started("oracle_response")
        return f"<action>{format_action(plan(self.app, self.state, self.config.stop_required)[0])}</action>"

    def random_response(self, rng) -> str:
        """A click on a random pixel of the screen (the SFT noise turns)."""
        return f"<action>click({rng.randrange(self.app.width)}, {rng.randrange(self.app.height)})</action>"

    def format_response(self, line: str) -> str:
        """A typed answer as a response: `click(3, 4)` becomes `<action>click(3, 4)</action>`."""
        return line if "<action>" in line.lower() else f"<action>{line}</action>"

    def render_text(self) -> str:
        """The shown screen as text, one widget a line (for `vlrl env play` in a terminal)."""
        self._check_started("render_text")
        return describe_screen(self.app, self.state)

    def episode_metrics(self) -> dict[str, float]:
        """success, turns, invalid_actions, misclicks, optimal_turns, return, solvable, level."""
        self._check_started("episode_metrics")
        return {
            "success": float(self.success),
            "turns": float(len(self.turns)),
            "invalid_actions": float(self.invalid_actions),
            "misclicks": float(self.misclicks),
            "optimal_turns": float(self.optimal),
            "return": float(self.episode_return),
            "solvable": float(self.optimal <= self.config.max_turns),
            "level": float(self.app.level),
        }

    def trace(self) -> dict[str, Any]:
        """The episode as JSON (format `vlrl.gui.trace/1`, see docs/gui.md)."""
        self._check_started("trace")
        return episode_trace(self, TRACE_FORMAT, "app", self.app.to_json(), state=self.state.to_json())

    @classmethod
    def replay_trace(cls, trace: dict[str, Any]) -> dict[str, Any]:
        """Re-run a trace from its app JSON and raw responses; report whether it matches.

        Returns {"success", "return", "turns", "matches", "problems"}: the replayed outcome, and
        the list of differences from what the trace records (empty when it is consistent).
        """
        return replay_env_trace(cls, trace, TRACE_FORMAT, "app", App.from_json)
