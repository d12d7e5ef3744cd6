"""The gui app model: generation, JSON round trip and validation, the state machine, rendering."""

from __future__ import annotations

import copy
import hashlib

import pytest

from vlrl.envs.gui.app import App, AppState, click, goal_holds, instruction, subgoal_potential, type_text
from vlrl.envs.gui.generate import LEVELS, apply_moved, generate_app
from vlrl.envs.gui.render import THEMES, render
from vlrl.errors import VlrlError


@pytest.mark.parametrize("level", LEVELS)
def test_json_round_trip_every_level(level):
    for seed in range(20):
        app = generate_app(level, 160, 160, seed)
        back = App.from_json(app.to_json())
        assert back == app and back.content_hash() == app.content_hash()
        moved = apply_moved(app, seed)
        assert App.from_json(moved.to_json()) == moved  # moved apps stay valid: inside, no overlaps


def test_generation_is_pinned():
    # A change to the generator must bump GENERATOR_VERSION (and so every split version).
    hashes = [generate_app(level, 160, 160, 3).content_hash()[:12] for level in LEVELS]
    again = [generate_app(level, 160, 160, 3).content_hash()[:12] for level in LEVELS]
    assert hashes == again
    assert len(set(hashes)) == 4


def test_level1_targets_sit_on_the_token_grid():
    for seed in range(50):
        app = generate_app(1, 96, 96, seed)
        buttons = app.screens[0].widgets
        assert 3 <= len(buttons) <= 5
        assert [w.style for w in buttons].count("accent") == 1
        for w in buttons:
            x0, y0, x1, y1 = w.box
            assert (x0 % 16, y0 % 16, x1 - x0, y1 - y0) == (0, 0, 16, 16)
        assert instruction(app) == "Click the highlighted button."


def _bad(app_json, mutate):
    data = copy.deepcopy(app_json)
    mutate(data)
    return data


APP4 = generate_app(4, 160, 160, 1).to_json()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("goal"), "missing key(s) ['goal']"),
        (lambda d: d.update(extra=1), "unknown key(s) ['extra']"),
        (lambda d: d.update(format="vlrl.gui.app/9"), "this version reads"),
        (lambda d: d.update(width=8), "'width' must be an integer"),
        (lambda d: d["screens"][0]["widgets"][0].update(kind="slider"), "unknown widget kind 'slider'"),
        (lambda d: d["screens"][0]["widgets"][0].update(box=[0, 0, 500, 10]), "is not a non-empty box inside"),
        (lambda d: d["screens"][0]["widgets"][0].update(box=[10, 10]), "must be [x0, y0, x1, y1]"),
        (lambda d: d["screens"][0]["widgets"][1].update(box=d["screens"][0]["widgets"][0]["box"]), "overlap"),
        (lambda d: d["screens"][0]["widgets"][1].update(id=d["screens"][0]["widgets"][0]["id"]), "used twice"),
        (lambda d: d["screens"][0]["widgets"][0].update(target=7), "must be a screen index"),
        (lambda d: d.update(goal={"set": {"nope": True}}), "is not a checkbox, toggle or text field"),
        (lambda d: d.update(goal={"press": "w0"}), "is not a plain (action press) button"),
        (lambda d: d.update(goal={}), "'goal' must be"),
        (lambda d: d.update(start_screen=5), "start_screen 5 is not a screen"),
    ],
)
def test_malformed_app_json_is_one_error_line(mutate, message):
    with pytest.raises(VlrlError) as err:
        App.from_json(_bad(APP4, mutate))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_not_an_object():
    with pytest.raises(VlrlError, match="app JSON must be an object"):
        App.from_json([1, 2])


def test_state_machine_save_cancel_and_goal():
    app = generate_app(2, 160, 160, 4)
    ((target, wanted),) = app.goal["set"].items()
    state = AppState.initial(app)
    widget = app.widget(target)
    save = app.buttons(0, "save")[0]
    cancel = app.buttons(0, "cancel")[0]
    assert subgoal_potential(app, state) == 0
    assert click(app, state, widget) == "flip" and state.values[target] == wanted
    assert subgoal_potential(app, state) == 1 and not goal_holds(app, state)  # set but not saved
    assert click(app, state, cancel) == "cancel" and state.values[target] != wanted  # undone
    click(app, state, widget)
    assert click(app, state, save) == "save" and goal_holds(app, state)
    assert subgoal_potential(app, state) == 2
    other = next(w for w in app.fields() if w.id != target)
    click(app, state, other)  # changing another field after saving: the saved state still holds the goal
    assert goal_holds(app, state) and subgoal_potential(app, state) == 1 + 0 - 1 + 1
    click(app, state, save)  # saving the extra change breaks the goal
    assert not goal_holds(app, state)


def test_typing_needs_focus_and_replaces_the_text():
    app = generate_app(3, 160, 160, 2)
    state = AppState.initial(app)
    assert not type_text(state, "x")
    ((target, wanted),) = app.goal["set"].items()
    assert click(app, state, app.widget(target)) == "focus"
    assert type_text(state, wanted) and state.values[target] == wanted


def test_level1_goal_is_the_target_and_nothing_else():
    app = generate_app(1, 96, 96, 0)
    target = app.widget(app.goal["press"])
    other = next(w for w in app.screens[0].widgets if w.id != target.id)
    state = AppState.initial(app)
    click(app, state, target)
    assert goal_holds(app, state)
    click(app, state, other)
    assert not goal_holds(app, state)


@pytest.mark.parametrize("theme", list(THEMES))
def test_render_is_deterministic_and_sized(theme):
    app = generate_app(4, 192, 160, 5)
    a = render(app, AppState.initial(app), theme, noise_seed=3)
    b = render(app, AppState.initial(app), theme, noise_seed=3)
    assert a.size == (192, 160) and a.tobytes() == b.tobytes()


def test_render_shows_state_changes():
    app = generate_app(2, 160, 160, 4)
    state = AppState.initial(app)
    before = render(app, state).tobytes()
    click(app, state, app.widget(next(iter(app.goal["set"]))))
    assert render(app, state).tobytes() != before


def test_render_survives_text_outside_latin1():
    app = generate_app(3, 160, 160, 2)
    state = AppState.initial(app)
    click(app, state, app.widget(next(iter(app.goal["set"]))))
    type_text(state, "日本")
    assert render(app, state).size == (160, 160)


def test_render_pinned_pixels():
    app = generate_app(2, 128, 128, 0)
    digest = hashlib.sha256(render(app, AppState.initial(app)).tobytes()).hexdigest()
    assert digest == hashlib.sha256(render(App.from_json(app.to_json()), AppState.initial(app)).tobytes()).hexdigest()
