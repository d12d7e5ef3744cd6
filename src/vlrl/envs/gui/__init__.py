"""The GUI env: procedurally generated app screens, controlled from screenshots by clicks and typing.

Importing this package registers the `gui` environment. See docs/gui.md.
"""

from vlrl.envs.gui.actions import Action, format_action, parse_action
from vlrl.envs.gui.app import App, AppState, Screen, Widget, goal_holds, instruction
from vlrl.envs.gui.config import GuiEnvConfig
from vlrl.envs.gui.env import PROMPT_TEXTS, GuiEnv
from vlrl.envs.gui.generate import LEVELS, apply_moved, generate_app
from vlrl.envs.gui.oracle import optimal_turns, plan
from vlrl.envs.gui.render import THEMES, render
from vlrl.envs.gui.splits import Split, adhoc_task, app_for_task, layout_split

__all__ = [
    "Action",
    "format_action",
    "parse_action",
    "App",
    "AppState",
    "Screen",
    "Widget",
    "goal_holds",
    "instruction",
    "GuiEnvConfig",
    "PROMPT_TEXTS",
    "GuiEnv",
    "LEVELS",
    "apply_moved",
    "generate_app",
    "optimal_turns",
    "plan",
    "THEMES",
    "render",
    "Split",
    "adhoc_task",
    "app_for_task",
    "layout_split",
]
