"""Draw the shown screen of an app as an RGB screenshot with PIL.

Text uses Pillow's built-in bitmap font (6 x 11 px per character, no anti-aliasing), so the same
app, state and theme give byte-identical images on any machine. Drawing order: background, title
bar (when the app has a title), widgets in list order, then (theme `noise`) pixel noise seeded by
`noise_seed`.

How each widget looks: a button is a rounded rectangle filling its box (`accent` style in the
theme's accent colour, a pressed plain button darker), label centred; a checkbox a 12 px square
(ticked when on) then its label; a toggle its label then a 24 x 12 switch at the box's right end
(accent and knob right when on); a text field an input rectangle (accent border and a caret when
focused) with its label right-aligned to the left of the box; a tab its name, the shown screen's
tab underlined in the accent colour.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vlrl.envs.gui.app import App, AppState, Widget
from vlrl.errors import VlrlError

RGB = tuple[int, int, int]
FONT = ImageFont.load_default_imagefont()
TEXT_H = 11


@dataclass(frozen=True)
class Theme:
    background: RGB
    text: RGB
    bar: RGB  # title bar
    bar_text: RGB
    plain: RGB  # plain button / control background
    border: RGB
    accent: RGB
    accent_text: RGB
    noise: int = 0  # amplitude of uniform per-pixel noise


THEMES: dict[str, Theme] = {
    "light": Theme(
        (250, 250, 250),
        (30, 30, 30),
        (52, 101, 164),
        (255, 255, 255),
        (220, 220, 224),
        (150, 150, 160),
        (0, 110, 255),
        (255, 255, 255),
    ),
    "dark": Theme(
        (32, 33, 38),
        (225, 225, 230),
        (60, 62, 74),
        (240, 240, 240),
        (70, 72, 82),
        (110, 112, 125),
        (255, 150, 40),
        (20, 20, 20),
    ),
    "contrast": Theme(
        (255, 255, 255), (0, 0, 0), (0, 0, 0), (255, 255, 0), (255, 255, 255), (0, 0, 0), (200, 0, 120), (255, 255, 255)
    ),
    "noise": Theme(
        (250, 250, 250),
        (30, 30, 30),
        (52, 101, 164),
        (255, 255, 255),
        (220, 220, 224),
        (150, 150, 160),
        (0, 110, 255),
        (255, 255, 255),
        40,
    ),
}


def _darker(c: RGB, k: float = 0.75) -> RGB:
    return (int(c[0] * k), int(c[1] * k), int(c[2] * k))


def _text(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, fill: RGB) -> None:
    # The bitmap font covers Latin-1; anything else (typed by a model) is drawn as '?'.
    draw.text(xy, text.encode("latin-1", "replace").decode("latin-1"), font=FONT, fill=fill)


def _text_w(text: str) -> int:
    return int(FONT.getlength(text.encode("latin-1", "replace").decode("latin-1")))


def render(app: App, state: AppState, theme: str = "light", noise_seed: int | None = None) -> Image.Image:
    """The screenshot of `state.screen`, app.width x app.height pixels."""
    if theme not in THEMES:
        raise VlrlError(f"unknown gui theme {theme!r}; known: {', '.join(THEMES)}")
    t = THEMES[theme]
    image = Image.new("RGB", (app.width, app.height), t.background)
    draw = ImageDraw.Draw(image)
    if app.title:
        draw.rectangle([0, 0, app.width - 1, 15], fill=t.bar)
        _text(draw, (8, 2), app.title, t.bar_text)
    for w in app.screens[state.screen].widgets:
        _WIDGETS[w.kind](draw, w, state, t)
    if t.noise:
        rng = np.random.default_rng(0 if noise_seed is None else noise_seed)
        noise = rng.integers(-t.noise, t.noise + 1, size=(app.height, app.width, 3), dtype=np.int16)
        image = Image.fromarray(np.clip(np.asarray(image, dtype=np.int16) + noise, 0, 255).astype(np.uint8), "RGB")
    return image


def _mid_y(w: Widget) -> int:
    return (w.box[1] + w.box[3]) // 2


def _button(draw: ImageDraw.ImageDraw, w: Widget, state: AppState, t: Theme) -> None:
    x0, y0, x1, y1 = w.box
    fill = t.accent if w.style == "accent" else t.plain
    if w.id in state.pressed and w.action == "press":
        fill = _darker(fill)
    draw.rounded_rectangle([x0 + 1, y0 + 1, x1 - 2, y1 - 2], radius=3, fill=fill, outline=t.border)
    if w.label:
        fg = t.accent_text if w.style == "accent" else t.text
        _text(draw, ((x0 + x1 - _text_w(w.label)) // 2, _mid_y(w) - TEXT_H // 2), w.label, fg)


def _checkbox(draw: ImageDraw.ImageDraw, w: Widget, state: AppState, t: Theme) -> None:
    x0, y = w.box[0], _mid_y(w)
    on = bool(state.values[w.id])
    draw.rectangle([x0 + 2, y - 6, x0 + 13, y + 5], fill=t.accent if on else t.background, outline=t.border)
    if on:
        draw.line([(x0 + 4, y), (x0 + 7, y + 3), (x0 + 12, y - 4)], fill=t.accent_text, width=2)
    _text(draw, (x0 + 18, y - TEXT_H // 2), w.label, t.text)


def _toggle(draw: ImageDraw.ImageDraw, w: Widget, state: AppState, t: Theme) -> None:
    x0, x1, y = w.box[0], w.box[2], _mid_y(w)
    on = bool(state.values[w.id])
    _text(draw, (x0 + 2, y - TEXT_H // 2), w.label, t.text)
    draw.rounded_rectangle(
        [x1 - 26, y - 6, x1 - 3, y + 5], radius=6, fill=t.accent if on else t.plain, outline=t.border
    )
    knob = x1 - 14 if on else x1 - 26
    draw.ellipse([knob + 1, y - 5, knob + 10, y + 4], fill=t.background, outline=t.border)


def _textfield(draw: ImageDraw.ImageDraw, w: Widget, state: AppState, t: Theme) -> None:
    x0, y0, x1, y1 = w.box
    focused = state.focus == w.id
    draw.rectangle([x0, y0 + 1, x1 - 1, y1 - 2], fill=t.background, outline=t.accent if focused else t.border)
    _text(draw, (x0 - 4 - _text_w(w.label), _mid_y(w) - TEXT_H // 2), w.label, t.text)
    value = str(state.values[w.id])
    room = max(0, (x1 - x0 - 6) // 6)
    shown = value[-room:] if room else ""
    _text(draw, (x0 + 3, _mid_y(w) - TEXT_H // 2), shown, t.text)
    if focused:
        cx = x0 + 3 + _text_w(shown) + 1
        draw.line([(cx, y0 + 3), (cx, y1 - 4)], fill=t.accent)


def _tab(draw: ImageDraw.ImageDraw, w: Widget, state: AppState, t: Theme) -> None:
    x0, y0, x1, y1 = w.box
    current = state.screen == w.target
    _text(draw, ((x0 + x1 - _text_w(w.label)) // 2, y0 + 2), w.label, t.accent if current else t.text)
    draw.line([(x0, y1 - 1), (x1 - 1, y1 - 1)], fill=t.accent if current else t.border, width=1)
    if current:
        draw.rectangle([x0, y1 - 3, x1 - 1, y1 - 1], fill=t.accent)


_WIDGETS = {"button": _button, "checkbox": _checkbox, "toggle": _toggle, "textfield": _textfield, "tab": _tab}
