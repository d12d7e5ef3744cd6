"""A GUI app as data: screens of widgets, a goal, and the state machine that clicks and types.

Coordinates are image pixels, (x, y) with (0, 0) the top-left corner. A widget's `box` is
`[x0, y0, x1, y1]`, half-open: a click at (x, y) hits it iff x0 <= x < x1 and y0 <= y < y1. Boxes
on one screen never overlap, so a click hits at most one widget.

Widget kinds (the keys each one has besides `id`, `kind`, `label`, `box`):

- `button`: `action` (`press`: a plain button, level 1; `save`: copies the current values into
  the saved state; `cancel`: puts the saved values back, or the initial ones before any save)
  and `style` (`plain` | `accent`: drawn highlighted). A click records the press.
- `checkbox`, `toggle`: `value` (bool). A click flips it; the label is inside the box (clicking
  the label flips it too, as in HTML forms).
- `textfield`: `value` (str, at most MAX_TEXT characters). The box is the input rectangle; its
  label is drawn to its left, outside the box. A click focuses it; `type("...")` then replaces
  its text (as if its content were selected first).
- `tab`: `target` (a screen index). A click shows that screen.

The goal is verified from the app's state only (`goal_holds`):

- `{"press": ID}`: the button ID was pressed and no other button was (level 1; a wrong press
  cannot be undone, as in a real app).
- `{"set": {ID: value, ...}}`: the SAVED state equals the initial values with these changes and
  every other field unchanged: setting the fields is not enough, Save must be pressed after.

JSON form (`App.to_json`, read back identically by `App.from_json`, which rejects malformed
input with one VlrlError line naming the problem)::

    {"format": "vlrl.gui.app/1", "generator": "gui-1", "level": 2, "seed": 7, "variant": "none",
     "width": 160, "height": 160, "title": "Settings", "start_screen": 0,
     "screens": [{"name": "Settings", "widgets": [
         {"id": "w0", "kind": "toggle", "label": "Wi-Fi", "box": [8, 32, 152, 48], "value": false},
         {"id": "w3", "kind": "button", "label": "Save", "box": [96, 144, 144, 160],
          "action": "save", "style": "accent"}]}],
     "goal": {"set": {"w0": true}}}

The instruction shown to the model is derived from the goal (`instruction`), never stored, so
an app's JSON cannot contradict its own task.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from vlrl.errors import VlrlError

FORMAT = "vlrl.gui.app/1"
KINDS = ("button", "checkbox", "toggle", "textfield", "tab")
BUTTON_ACTIONS = ("press", "save", "cancel")
STYLES = ("plain", "accent")
FIELD_KINDS = ("checkbox", "toggle", "textfield")  # widgets with a value: the app's fields
MAX_TEXT = 24  # characters of a text field's value and of one type("...") action
MAX_SIDE = 1024
_KIND_KEYS = {
    "button": {"action", "style"},
    "checkbox": {"value"},
    "toggle": {"value"},
    "textfield": {"value"},
    "tab": {"target"},
}

Value = bool | str


@dataclass(frozen=True)
class Widget:
    """One widget of a screen; the kind's own keys (value, action, style, target) are None for other kinds."""

    id: str
    kind: str
    label: str
    box: tuple[int, int, int, int]
    value: Value | None = None
    action: str | None = None
    style: str | None = None
    target: int | None = None

    def contains(self, x: int, y: int) -> bool:
        x0, y0, x1, y1 = self.box
        return x0 <= x < x1 and y0 <= y < y1

    def centre(self) -> tuple[int, int]:
        """The pixel the oracle clicks: the middle of the box (rounded down)."""
        x0, y0, x1, y1 = self.box
        return (x0 + x1) // 2, (y0 + y1) // 2

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "kind": self.kind, "label": self.label, "box": list(self.box)}
        for key in sorted(_KIND_KEYS[self.kind]):
            data[key] = getattr(self, key)
        return data

    def layout_json(self) -> dict[str, Any]:
        """What the widget is, without its value or style: its part of the app's layout key."""
        data = {"kind": self.kind, "label": self.label, "box": list(self.box)}
        if self.kind == "button":
            data["action"] = self.action
        if self.kind == "tab":
            data["target"] = self.target
        return data


@dataclass(frozen=True)
class Screen:
    name: str
    widgets: tuple[Widget, ...]

    def hit(self, x: int, y: int) -> Widget | None:
        return next((w for w in self.widgets if w.contains(x, y)), None)


@dataclass(frozen=True)
class App:
    """A generated (or hand-written) app: screens, goal, and provenance (generator, seed, variant)."""

    level: int
    width: int
    height: int
    title: str
    screens: tuple[Screen, ...]
    goal: dict[str, Any]
    start_screen: int = 0
    seed: int = 0
    variant: str = "none"
    generator: str = "gui-1"
    _index: dict[str, tuple[int, Widget]] = field(default=None, repr=False, compare=False, hash=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        index = {w.id: (s, w) for s, screen in enumerate(self.screens) for w in screen.widgets}
        object.__setattr__(self, "_index", index)

    # -- lookups -----------------------------------------------------------------------------
    def widget(self, widget_id: str) -> Widget:
        return self._index[widget_id][1]

    def screen_of(self, widget_id: str) -> int:
        return self._index[widget_id][0]

    def fields(self) -> list[Widget]:
        """Every widget with a value, screen by screen."""
        return [w for screen in self.screens for w in screen.widgets if w.kind in FIELD_KINDS]

    def initial_values(self) -> dict[str, Value]:
        return {w.id: w.value for w in self.fields()}  # type: ignore[misc]

    def target_values(self) -> dict[str, Value]:
        """The values the saved state must hold for a `set` goal: initial ones with the goal's changes."""
        return {**self.initial_values(), **self.goal.get("set", {})}

    def buttons(self, screen: int, action: str) -> list[Widget]:
        return [w for w in self.screens[screen].widgets if w.kind == "button" and w.action == action]

    def route(self, screen: int, target: int) -> list[Widget] | None:
        """The fewest tabs to click to get from `screen` to `target` ([] when there), None if unreachable."""
        paths: dict[int, list[Widget]] = {screen: []}
        frontier = [screen]
        while frontier and target not in paths:
            nxt = []
            for s in frontier:
                for w in self.screens[s].widgets:
                    if w.kind == "tab" and w.target not in paths:
                        paths[w.target] = paths[s] + [w]  # type: ignore[index]
                        nxt.append(w.target)
            frontier = nxt
        return paths.get(target)

    # -- identity ----------------------------------------------------------------------------
    def layout_json(self) -> dict[str, Any]:
        """The layout: size, title and every widget's kind, label, box (and button action, tab target)."""
        return {
            "size": [self.width, self.height],
            "title": self.title,
            "screens": [{"name": s.name, "widgets": [w.layout_json() for w in s.widgets]} for s in self.screens],
        }

    def layout_hash(self) -> str:
        """SHA-256 of the layout alone (no values, styles, goal or provenance): what splits are disjoint by."""
        return _sha(self.layout_json())

    def content_hash(self) -> str:
        """SHA-256 of everything the agent faces: the whole app without its provenance."""
        data = self.to_json()
        for key in ("generator", "seed", "variant"):
            data.pop(key)
        return _sha(data)

    # -- JSON --------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "generator": self.generator,
            "level": self.level,
            "seed": self.seed,
            "variant": self.variant,
            "width": self.width,
            "height": self.height,
            "title": self.title,
            "start_screen": self.start_screen,
            "screens": [{"name": s.name, "widgets": [w.to_json() for w in s.widgets]} for s in self.screens],
            "goal": json.loads(json.dumps(self.goal)),
        }

    @classmethod
    def from_json(cls, data: Any) -> App:
        """Read and validate the JSON form; raises VlrlError naming the first problem."""
        _keys(
            data,
            "app JSON",
            {
                "format",
                "generator",
                "level",
                "seed",
                "variant",
                "width",
                "height",
                "title",
                "start_screen",
                "screens",
                "goal",
            },
        )
        if data["format"] != FORMAT:
            raise VlrlError(f"app JSON format is {data['format']!r}; this version reads {FORMAT!r}")
        for key in ("generator", "variant", "title"):
            _check(isinstance(data[key], str), f"'{key}' must be a string, got {data[key]!r}")
        for key in ("level", "seed", "start_screen"):
            _check(_is_int(data[key]), f"'{key}' must be an integer, got {data[key]!r}")
        width, height = data["width"], data["height"]
        for key, side in (("width", width), ("height", height)):
            _check(
                _is_int(side) and 16 <= side <= MAX_SIDE,
                f"'{key}' must be an integer from 16 to {MAX_SIDE}, got {side!r}",
            )
        screens_json = data["screens"]
        _check(isinstance(screens_json, list) and screens_json, "'screens' must be a non-empty list")
        screens = tuple(_read_screen(s, i, len(screens_json), width, height) for i, s in enumerate(screens_json))
        app = cls(
            data["level"],
            width,
            height,
            data["title"],
            screens,
            data["goal"],
            data["start_screen"],
            data["seed"],
            data["variant"],
            data["generator"],
        )
        check_app(app)
        return app


def _sha(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise VlrlError(f"app JSON: {message}")


def _keys(data: Any, what: str, keys: set[str]) -> None:
    if not isinstance(data, dict):
        raise VlrlError(f"{what} must be an object, got {type(data).__name__}")
    missing, extra = keys - set(data), set(data) - keys
    if missing:
        raise VlrlError(f"{what} is missing key(s) {sorted(missing)}")
    if extra:
        raise VlrlError(f"{what} has unknown key(s) {sorted(extra)}")


def _read_screen(data: Any, index: int, screens: int, width: int, height: int) -> Screen:
    _keys(data, f"app JSON: screens[{index}]", {"name", "widgets"})
    _check(isinstance(data["name"], str), f"screens[{index}].name must be a string")
    _check(isinstance(data["widgets"], list), f"screens[{index}].widgets must be a list")
    widgets = tuple(
        _read_widget(w, f"screens[{index}].widgets[{j}]", screens, width, height) for j, w in enumerate(data["widgets"])
    )
    return Screen(data["name"], widgets)


def _read_widget(data: Any, where: str, screens: int, width: int, height: int) -> Widget:
    if not isinstance(data, dict) or data.get("kind") not in KINDS:
        kind = data.get("kind") if isinstance(data, dict) else data
        raise VlrlError(f"app JSON: {where}: unknown widget kind {kind!r}; known: {', '.join(KINDS)}")
    kind = data["kind"]
    _keys(data, f"app JSON: {where} ({kind})", {"id", "kind", "label", "box"} | _KIND_KEYS[kind])
    _check(isinstance(data["id"], str) and data["id"], f"{where}.id must be a non-empty string")
    _check(isinstance(data["label"], str), f"{where}.label must be a string")
    box = data["box"]
    _check(
        isinstance(box, list) and len(box) == 4 and all(_is_int(v) for v in box),
        f"{where}.box must be [x0, y0, x1, y1] integers, got {box!r}",
    )
    x0, y0, x1, y1 = box
    _check(
        0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height,
        f"{where}.box {box} is not a non-empty box inside the {width}x{height} screen",
    )
    value = data.get("value")
    if kind in ("checkbox", "toggle"):
        _check(isinstance(value, bool), f"{where}.value must be true or false, got {value!r}")
    if kind == "textfield":
        _check(
            isinstance(value, str) and len(value) <= MAX_TEXT,
            f"{where}.value must be a string of at most {MAX_TEXT} characters",
        )
    if kind == "button":
        _check(
            data["action"] in BUTTON_ACTIONS,
            f"{where}.action must be one of {', '.join(BUTTON_ACTIONS)}, got {data['action']!r}",
        )
        _check(data["style"] in STYLES, f"{where}.style must be one of {', '.join(STYLES)}, got {data['style']!r}")
    if kind == "tab":
        _check(
            _is_int(data["target"]) and 0 <= data["target"] < screens,
            f"{where}.target must be a screen index below {screens}, got {data['target']!r}",
        )
    return Widget(
        data["id"],
        kind,
        data["label"],
        (x0, y0, x1, y1),
        value,
        data.get("action"),
        data.get("style"),
        data.get("target"),
    )


def check_app(app: App) -> None:
    """Raise VlrlError unless ids are unique, boxes of a screen do not overlap and the goal is possible."""
    seen: set[str] = set()
    for s, screen in enumerate(app.screens):
        for i, w in enumerate(screen.widgets):
            _check(w.id not in seen, f"widget id {w.id!r} is used twice")
            seen.add(w.id)
            for other in screen.widgets[:i]:
                a, b = w.box, other.box
                _check(
                    a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1],
                    f"widgets {other.id!r} and {w.id!r} on screen {s} overlap",
                )
    _check(0 <= app.start_screen < len(app.screens), f"start_screen {app.start_screen} is not a screen")
    reachable = {s for s in range(len(app.screens)) if app.route(app.start_screen, s) is not None}
    goal = app.goal
    _check(
        isinstance(goal, dict) and len(goal) == 1 and set(goal) <= {"press", "set"},
        f'\'goal\' must be {{"press": ID}} or {{"set": {{ID: value, ...}}}}, got {goal!r}',
    )
    if "press" in goal:
        target = goal["press"]
        _check(
            target in seen and app.widget(target).kind == "button" and app.widget(target).action == "press",
            f"goal: press target {target!r} is not a plain (action press) button",
        )
        _check(app.screen_of(target) in reachable, f"goal: no tabs lead from the start screen to {target!r}")
        return
    changes = goal["set"]
    _check(isinstance(changes, dict) and changes, "goal: 'set' must be a non-empty object {ID: value}")
    for wid, value in changes.items():
        _check(
            wid in seen and app.widget(wid).kind in FIELD_KINDS,
            f"goal: {wid!r} is not a checkbox, toggle or text field",
        )
        kind = app.widget(wid).kind
        ok = isinstance(value, bool) if kind != "textfield" else isinstance(value, str) and len(value) <= MAX_TEXT
        _check(ok, f"goal: value {value!r} does not fit the {kind} {wid!r}")
        _check(app.screen_of(wid) in reachable, f"goal: no tabs lead from the start screen to {wid!r}")
    _check(
        any(app.buttons(s, "save") for s in reachable),
        "goal: a 'set' goal needs a save button on a screen the tabs reach",
    )


# ---------------------------------------------------------------------------------------------
# state


@dataclass
class AppState:
    """What the app is now: the screen shown, current and saved values, presses, the focused field."""

    screen: int
    values: dict[str, Value]
    saved: dict[str, Value] | None = None  # None until Save is pressed
    pressed: list[str] = field(default_factory=list)
    focus: str | None = None

    @classmethod
    def initial(cls, app: App) -> AppState:
        return cls(app.start_screen, app.initial_values())

    def copy(self) -> AppState:
        return AppState(
            self.screen,
            dict(self.values),
            None if self.saved is None else dict(self.saved),
            list(self.pressed),
            self.focus,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "screen": self.screen,
            "values": dict(self.values),
            "saved": self.saved,
            "pressed": list(self.pressed),
            "focus": self.focus,
        }


def click(app: App, state: AppState, widget: Widget) -> str:
    """Apply a click on `widget` (on the shown screen) to `state`; returns the effect's name."""
    if widget.kind != "textfield":
        state.focus = None  # clicking anything else takes the focus away, as in a real form
    if widget.kind == "tab":
        state.screen = widget.target  # type: ignore[assignment]
        return "tab"
    if widget.kind in ("checkbox", "toggle"):
        state.values[widget.id] = not state.values[widget.id]
        return "flip"
    if widget.kind == "textfield":
        state.focus = widget.id
        return "focus"
    state.pressed.append(widget.id)
    if widget.action == "save":
        state.saved = dict(state.values)
    elif widget.action == "cancel":
        state.values = dict(state.saved if state.saved is not None else app.initial_values())
    return widget.action or "press"


def type_text(state: AppState, text: str) -> bool:
    """Replace the focused field's text; False (nothing changes) when no field is focused."""
    if state.focus is None:
        return False
    state.values[state.focus] = text
    return True


def goal_holds(app: App, state: AppState) -> bool:
    """Whether the app's state satisfies its goal (see the module docstring)."""
    if "press" in app.goal:
        return set(state.pressed) == {app.goal["press"]}
    return state.saved is not None and state.saved == app.target_values()


def subgoal_potential(app: App, state: AppState) -> int:
    """Shaping potential: goal fields at their target - other fields changed (+1 once the goal holds)."""
    done = int(goal_holds(app, state))
    if "press" in app.goal:
        return done
    initial, wanted = app.initial_values(), app.goal["set"]
    right = sum(state.values[w] == v for w, v in wanted.items())
    wrong = sum(state.values[w] != initial[w] for w in initial if w not in wanted)
    return right - wrong + done


# ---------------------------------------------------------------------------------------------
# the task in words


def _quote(text: str) -> str:
    return f'"{text}"'


def describe_change(app: App, widget_id: str, value: Value) -> str:
    w = app.widget(widget_id)
    if w.kind == "toggle":
        return f"turn {'on' if value else 'off'} {_quote(w.label)}"
    if w.kind == "checkbox":
        return f"{'check' if value else 'uncheck'} {_quote(w.label)}"
    return f"type {_quote(str(value))} into the {_quote(w.label)} field"


def instruction(app: App) -> str:
    """The task in words, derived from the goal, e.g. `Turn on "Wi-Fi", then press Save.`"""
    if "press" in app.goal:
        return "Click the highlighted button."
    parts = []
    for wid, value in app.goal["set"].items():
        text = describe_change(app, wid, value)
        screen = app.screen_of(wid)
        if len(app.screens) > 1:
            text += f" on the {_quote(app.screens[screen].name)} tab"
        parts.append(text)
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    save = app.buttons(next(s for s in range(len(app.screens)) if app.buttons(s, "save")), "save")[0].label
    return f"{text[0].upper()}{text[1:]}, then press {_quote(save)}."


def describe_screen(app: App, state: AppState) -> str:
    """The shown screen in words, one widget a line with its state, box and centre (terminal play)."""
    screen = app.screens[state.screen]
    lines = [f"screen {state.screen} {screen.name!r} of {app.title or 'the app'!r}, {app.width}x{app.height} px"]
    for w in screen.widgets:
        if w.kind in ("checkbox", "toggle"):
            shown = "on" if state.values[w.id] else "off"
        elif w.kind == "textfield":
            shown = repr(state.values[w.id]) + (" (focused)" if state.focus == w.id else "")
        elif w.kind == "tab":
            shown = "(shown)" if w.target == state.screen else ""
        else:
            shown = " ".join(
                word for word, on in (("highlighted", w.style == "accent"), ("pressed", w.id in state.pressed)) if on
            )
        cx, cy = w.centre()
        lines.append(f"  {w.kind} {w.label!r} {shown} box {list(w.box)} centre ({cx}, {cy})".replace("  box", " box"))
    return "\n".join(lines)
