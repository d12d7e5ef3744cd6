"""The action language: `click(x, y)`, `type("text")`, `stop`, inside the LAST `<action>` tag.

- `click(x, y)`: integers (optionally negative, so an off-screen click parses and is then refused
  as outside the screen), in pixels of the screenshot as the env produced it, spaces allowed.
- `type("text")`: a double-quoted string; `\\"` and `\\\\` escape a quote and a backslash; at most
  MAX_TEXT characters, no line breaks.
- `stop`.

Names are case-insensitive and whitespace around the action is ignored. Anything else
(`click(12)`, `type(`, `click(1.5, 2)`, `press Save`) does not parse: `parse_action` returns None.
`format_action` writes the canonical form, which parses back to the same action.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vlrl.envs.gui.app import MAX_TEXT

_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_CLICK = re.compile(r"click\(\s*(-?\d{1,6})\s*,\s*(-?\d{1,6})\s*\)", re.IGNORECASE)
_TYPE = re.compile(r'type\(\s*"((?:[^"\\\n]|\\["\\])*)"\s*\)', re.IGNORECASE)


@dataclass(frozen=True)
class Action:
    kind: str  # click | type | stop
    x: int = 0
    y: int = 0
    text: str = ""


def parse_action(text: str) -> Action | None:
    """The action of the last `<action>` tag, or None when there is none or it does not parse."""
    tags = _ACTION_TAG.findall(text or "")
    if not tags:
        return None
    body = tags[-1].strip()
    if body.lower() == "stop":
        return Action("stop")
    if m := _CLICK.fullmatch(body):
        return Action("click", int(m.group(1)), int(m.group(2)))
    if m := _TYPE.fullmatch(body):
        typed = re.sub(r"\\([\"\\])", r"\1", m.group(1))
        return Action("type", text=typed) if len(typed) <= MAX_TEXT else None
    return None


def format_action(action: Action) -> str:
    """The canonical text of an action, e.g. `click(40, 24)` or `type("Ada")`."""
    if action.kind == "click":
        return f"click({action.x}, {action.y})"
    if action.kind == "type":
        escaped = action.text.replace("\\", "\\\\").replace('"', '\\"')
        return f'type("{escaped}")'
    return "stop"
