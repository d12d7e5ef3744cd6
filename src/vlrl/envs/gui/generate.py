"""Procedural apps, one generator per difficulty level.

- Level 1: icon buttons (16 x 16 px, one image token of the tiny models each) on the 16-px grid,
  never touching; one is highlighted and the task is to click it. Learnable without reading.
- Level 2: a settings screen (title bar, rows of toggles and checkboxes with labels, Save and
  Cancel); the task names one control by its label: turn it on/off or (un)check it, then Save.
- Level 3: a form with text fields (label left of the input) among toggles and checkboxes: type a
  given word into the field with a given label, then Save.
- Level 4: two or three screens behind tabs, Save and Cancel on each; two changes (a control and
  a text field, or two of either) on two different screens, then Save.

`distractors` is the number of widgets besides the targets (level 1: other buttons; levels 2-4:
other controls per screen, as many as the screen holds). The random stream is Python's Mersenne
Twister seeded by SHA-256 of (GENERATOR_VERSION, level, size, seed, attempt) and read only through
`getrandbits`, so the same seed gives the same app on any Python version.

Variants of the adversarial split (`apply_moved`, and a size or distractor count that training
does not use) are applied to, or generated beside, a base app whose layout decides the split.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TypeVar

from vlrl.envs.gui.app import App, Screen, Widget
from vlrl.errors import VlrlError

GENERATOR_VERSION = "gui-1"
LEVELS = (1, 2, 3, 4)
GRID = 16  # px: one merged image token of the tiny Qwen3-VL models (patch 8 x merge 2)
CHAR_PX = 6  # width of one character of the bitmap font (render.FONT)
MARGIN = 8
# Smallest screen (width, height) each level fits in.
MIN_SIZE = {1: (48, 48), 2: (128, 96), 3: (128, 96), 4: (160, 128)}

TITLES = ("Settings", "Profile", "Mail", "Music", "Photos", "Notes", "Clock", "Maps", "Files", "Chat", "Health", "Shop")
CONTROL_LABELS = (
    "Dark mode",
    "Wi-Fi",
    "Bluetooth",
    "Sounds",
    "Auto save",
    "Sync",
    "Location",
    "Alerts",
    "Backup",
    "Updates",
    "Vibrate",
    "Autoplay",
    "Captions",
    "Night light",
    "Roaming",
    "Hotspot",
    "Airplane",
    "Cookies",
    "Reminders",
    "Zoom",
)
FIELD_LABELS = ("Name", "City", "Email", "Phone", "Title", "Team", "Code", "Nick", "Street", "Country", "Job", "Pet")
WORDS = (
    "Ada",
    "Paris",
    "blue",
    "Oslo",
    "Lima",
    "Kyoto",
    "Rome",
    "Max",
    "Zoe",
    "Leo",
    "red",
    "green",
    "1234",
    "2048",
    "Berlin",
    "Milo",
    "Nora",
    "Cairo",
    "Quito",
    "Ivy",
    "Sam",
    "tea",
    "Luna",
    "Bob",
)
TAB_NAMES = ("General", "Privacy", "Sound", "Display", "Account", "Network", "Storage")
SAVE, CANCEL = "Save", "Cancel"

T = TypeVar("T")


class Rng:
    """A seeded random stream that uses only `getrandbits` (stable across Python versions)."""

    def __init__(self, key: str):
        self._r = random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))

    def below(self, k: int) -> int:
        if k <= 1:
            return 0
        bits = (k - 1).bit_length()
        while True:
            r = self._r.getrandbits(bits)
            if r < k:
                return r

    def between(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi]."""
        return lo + self.below(hi - lo + 1)

    def choice(self, items: Sequence[T]) -> T:
        return items[self.below(len(items))]

    def shuffled(self, items: Sequence[T]) -> list[T]:
        out = list(items)
        for k in range(len(out) - 1, 0, -1):
            j = self.below(k + 1)
            out[k], out[j] = out[j], out[k]
        return out

    def sample(self, items: Sequence[T], k: int) -> list[T]:
        return self.shuffled(items)[:k]


def check_size(level: int, width: int, height: int) -> None:
    """Raise VlrlError unless a screen of width x height holds apps of `level`."""
    if level not in LEVELS:
        raise VlrlError(f"unknown gui level {level!r}; levels are {', '.join(map(str, LEVELS))}")
    w_min, h_min = MIN_SIZE[level]
    if width < w_min or height < h_min:
        raise VlrlError(f"a {width}x{height} screen is too small for level {level} (needs at least {w_min}x{h_min})")


def text_px(text: str) -> int:
    return CHAR_PX * len(text)


class _Ids:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"w{self.n - 1}"


def generate_app(
    level: int, width: int, height: int, seed: int, *, attempt: int = 0, distractors: tuple[int, int] = (2, 4)
) -> App:
    """The app of (level, size, seed, attempt) with a distractor count drawn from `distractors`."""
    check_size(level, width, height)
    rng = Rng(f"{GENERATOR_VERSION}:{level}:{width}x{height}:{seed}:{attempt}")
    n = rng.between(*distractors)
    build = {1: _level1, 2: _level2, 3: _level3, 4: _level4}[level]
    title, screens, goal = build(rng, width, height, n)
    return App(level, width, height, title, tuple(screens), goal, 0, seed, "none", GENERATOR_VERSION)


def _level1(rng: Rng, width: int, height: int, n: int) -> tuple[str, list[Screen], dict]:
    cols, rows = width // GRID, height // GRID
    chosen: list[tuple[int, int]] = []
    for cell in rng.shuffled([(r, c) for r in range(rows) for c in range(cols)]):
        if all(max(abs(cell[0] - r), abs(cell[1] - c)) >= 2 for r, c in chosen):  # never touching
            chosen.append(cell)
            if len(chosen) == n + 1:
                break
    target_cell = chosen[0]
    ids = _Ids()
    widgets = []
    for r, c in sorted(chosen):  # reading order: the list order does not give the target away
        box = (c * GRID, r * GRID, (c + 1) * GRID, (r + 1) * GRID)
        style = "accent" if (r, c) == target_cell else "plain"
        widgets.append(Widget(ids(), "button", "", box, action="press", style=style))
    target = next(w.id for w in widgets if w.style == "accent")
    return "", [Screen("Main", tuple(widgets))], {"press": target}


def _footer(rng: Rng, ids: _Ids, width: int, height: int) -> list[Widget]:
    """Save and Cancel, right-aligned on the bottom row, in a random order."""
    y0 = height - 24
    names = rng.shuffled([SAVE, CANCEL])
    out = []
    for i, name in enumerate(reversed(names)):  # right to left
        x1 = width - MARGIN - i * 56
        action, style = ("save", "accent") if name == SAVE else ("cancel", "plain")
        out.append(Widget(ids(), "button", name, (x1 - 48, y0, x1, y0 + GRID), action=action, style=style))
    return out[::-1]


def _control(rng: Rng, ids: _Ids, kind: str, label: str, y: int, width: int) -> Widget:
    if kind == "toggle":  # label left, switch at the right end; the whole row is clickable
        return Widget(ids(), "toggle", label, (MARGIN, y, width - MARGIN, y + GRID), value=bool(rng.below(2)))
    if kind == "checkbox":  # box then label, both clickable
        return Widget(
            ids(),
            "checkbox",
            label,
            (MARGIN, y, MARGIN + GRID + text_px(label) + 4, y + GRID),
            value=bool(rng.below(2)),
        )
    label_end = MARGIN + max(text_px(name) for name in FIELD_LABELS) + 4
    x0 = max(label_end, width - MARGIN - 80)
    value = rng.choice(WORDS) if rng.below(2) else ""
    return Widget(ids(), "textfield", label, (x0, y, width - MARGIN, y + GRID), value=value)


def _controls(
    rng: Rng, ids: _Ids, kinds: list[str], labels: dict[str, list[str]], top: int, width: int
) -> list[Widget]:
    return [_control(rng, ids, kind, labels[kind].pop(), top + i * GRID, width) for i, kind in enumerate(kinds)]


def _rows(height: int, top: int) -> int:
    """Control rows between `top` and the footer (which starts 24 px from the bottom, after a gap)."""
    return (height - 24 - GRID // 2 - top) // GRID


def _change(rng: Rng, widget: Widget) -> bool | str:
    if widget.kind == "textfield":
        return rng.choice([w for w in WORDS if w != widget.value])
    return not widget.value


def _single_screen(rng: Rng, width: int, height: int, n: int, field_targets: bool) -> tuple[str, list[Screen], dict]:
    ids = _Ids()
    title = rng.choice(TITLES)
    top = 2 * GRID
    count = min(1 + n, _rows(height, top))
    if field_targets:  # level 3: the target is a text field; up to two more fields among the controls
        fields = 1 + min(rng.below(3), count - 1)
        kinds = ["textfield"] * fields + [rng.choice(("toggle", "checkbox")) for _ in range(count - fields)]
    else:
        kinds = [rng.choice(("toggle", "checkbox")) for _ in range(count)]
    kinds = rng.shuffled(kinds)
    labels = {"toggle": rng.sample(CONTROL_LABELS, count), "checkbox": [], "textfield": rng.sample(FIELD_LABELS, count)}
    labels["checkbox"] = labels["toggle"]  # one pool: control labels stay distinct across both kinds
    widgets = _controls(rng, ids, kinds, labels, top, width)
    target = rng.choice([w for w in widgets if (w.kind == "textfield") == field_targets])
    widgets += _footer(rng, ids, width, height)
    return title, [Screen(title, tuple(widgets))], {"set": {target.id: _change(rng, target)}}


def _level2(rng: Rng, width: int, height: int, n: int) -> tuple[str, list[Screen], dict]:
    return _single_screen(rng, width, height, n, field_targets=False)


def _level3(rng: Rng, width: int, height: int, n: int) -> tuple[str, list[Screen], dict]:
    return _single_screen(rng, width, height, n, field_targets=True)


def _level4(rng: Rng, width: int, height: int, n: int) -> tuple[str, list[Screen], dict]:
    ids = _Ids()
    title = rng.choice(TITLES)
    names = rng.sample(TAB_NAMES, 2 + rng.below(2))
    tab_w = (width - 2 * MARGIN) // len(names)
    top = 3 * GRID
    count = min(1 + n, _rows(height, top))
    labels = {
        "toggle": rng.sample(CONTROL_LABELS, count * len(names)),
        "textfield": rng.sample(FIELD_LABELS, count * len(names)),
    }
    labels["checkbox"] = labels["toggle"]
    screens = []
    for name in names:
        tabs = [
            Widget(ids(), "tab", tab, (MARGIN + i * tab_w, GRID, MARGIN + (i + 1) * tab_w, 2 * GRID), target=i)
            for i, tab in enumerate(names)
        ]
        kinds = [rng.choice(("toggle", "checkbox", "textfield")) for _ in range(count)]
        widgets = tabs + _controls(rng, ids, kinds, labels, top, width) + _footer(rng, ids, width, height)
        screens.append(Screen(name, tuple(widgets)))
    # Two changes on two different screens; at least one of them is not on the start screen.
    first, second = rng.sample(range(len(names)), 2)
    changes = {}
    for s in sorted((first, second)):
        target = rng.choice([w for w in screens[s].widgets if w.kind in ("toggle", "checkbox", "textfield")])
        changes[target.id] = _change(rng, target)
    return title, screens, {"set": changes}


def apply_moved(app: App, seed: int) -> App:
    """The adversarial `moved` variant: widgets shifted off the 16-px grid.

    Level 1: each button by its own offset of 1-7 px per axis, towards the inside of the screen
    (buttons are at least 16 px apart, so they never touch). Levels 2-4: every control and footer
    button by one offset of 1-6 px per axis (tabs and the title bar stay).
    """
    rng = Rng(f"{GENERATOR_VERSION}:moved:{seed}")
    screens = []
    shared = (rng.between(1, 6), rng.between(1, 6))
    for screen in app.screens:
        widgets = []
        for w in screen.widgets:
            if w.kind == "tab":
                widgets.append(w)
                continue
            if app.level == 1:
                dx, dy = rng.between(1, 7), rng.between(1, 7)
                dx = -dx if w.box[2] + dx > app.width else dx
                dy = -dy if w.box[3] + dy > app.height else dy
            else:
                dx, dy = shared
            x0, y0, x1, y1 = w.box
            box = (x0 + dx, y0 + dy, min(x1 + dx, app.width), min(y1 + dy, app.height))
            widgets.append(Widget(w.id, w.kind, w.label, box, w.value, w.action, w.style, w.target))
        screens.append(Screen(screen.name, tuple(widgets)))
    return App(
        app.level,
        app.width,
        app.height,
        app.title,
        tuple(screens),
        app.goal,
        app.start_screen,
        app.seed,
        "moved",
        app.generator,
    )
