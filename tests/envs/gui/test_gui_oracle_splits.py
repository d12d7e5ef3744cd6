"""The gui oracle is a shortest plan (checked by breadth-first search); splits are disjoint by layout."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from vlrl.config import load_config
from vlrl.envs.base import build_split, make_env, split_version
from vlrl.envs.gui.actions import Action
from vlrl.envs.gui.app import App, AppState, click, goal_holds, type_text
from vlrl.envs.gui.config import GuiEnvConfig
from vlrl.envs.gui.generate import apply_moved, generate_app
from vlrl.envs.gui.oracle import plan
from vlrl.envs.gui.splits import app_for_task, layout_split, train_overlap
from vlrl.errors import VlrlError


def _key(state: AppState):
    return (
        state.screen,
        tuple(sorted(state.values.items())),
        None if state.saved is None else tuple(sorted(state.saved.items())),
        tuple(sorted(set(state.pressed))),
        state.focus,
    )


def bfs_distance(app, state: AppState, limit: int = 9) -> int:
    """Fewest actions (clicks on any widget of the shown screen, typing a goal text) until the goal holds."""
    texts = [v for v in app.goal.get("set", {}).values() if isinstance(v, str)]
    seen = {_key(state)}
    queue = deque([(state, 0)])
    while queue:
        s, d = queue.popleft()
        if goal_holds(app, s):
            return d
        if d == limit:
            continue
        nexts = []
        for w in app.screens[s.screen].widgets:
            t = s.copy()
            click(app, t, w)
            nexts.append(t)
        for text in texts:
            t = s.copy()
            if type_text(t, text):
                nexts.append(t)
        for t in nexts:
            if _key(t) not in seen:
                seen.add(_key(t))
                queue.append((t, d + 1))
    raise AssertionError("goal not reachable")


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_oracle_plan_is_shortest(level):
    for seed in range(12):
        app = generate_app(level, 160, 160, seed, distractors=(1, 2))
        state = AppState.initial(app)
        assert len(plan(app, state, stop_required=False)) == bfs_distance(app, state)


def test_oracle_recovers_from_wrong_changes_shortest():
    for seed in range(12):
        app = generate_app(2, 160, 160, seed, distractors=(2, 3))
        state = AppState.initial(app)
        for w in app.fields()[:2]:  # a wrong start: flip the first two fields and save
            click(app, state, w)
        click(app, state, app.buttons(0, "save")[0])
        assert len(plan(app, state, stop_required=False)) == bfs_distance(app, state)


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_oracle_solves_300_training_apps_per_level(level):
    config = GuiEnvConfig(levels=[level], width=160, height=160, max_turns=32)
    tasks = build_split(config, "train")
    env = make_env(config)
    env.render_images = False
    for i in range(300):
        env.reset(tasks[i])
        while not env.step(env.oracle_response()).done:
            pass
        m = env.episode_metrics()
        assert m["success"] == 1.0 and m["turns"] == m["optimal_turns"]


CONFIG = GuiEnvConfig(
    levels=[1, 2, 3, 4],
    width=160,
    height=160,
    holdout={"seed_start": 10_000_000, "count": 120},
    adversarial={"seed_start": 20_000_000, "count": 120},
)


def test_splits_are_disjoint_by_layout():
    train = [app_for_task(t) for t in build_split(CONFIG, "train")[:2000]]
    assert {layout_split(a) for a in train} == {"train"}
    train_layouts = {a.layout_hash() for a in train}
    for split in ("holdout", "adversarial"):
        tasks = build_split(CONFIG, split)
        assert train_overlap(list(tasks)) == []
        base = [t for t in tasks if not t.params["moved"]]
        assert not {app_for_task(t).layout_hash() for t in base} & train_layouts
    adv = build_split(CONFIG, "adversarial")
    variants = {t.params["variant"] for t in adv}
    assert variants == {"theme:dark", "theme:contrast", "theme:noise", "resolution:192", "distractors:+3", "moved"}
    assert {t.params["level"] for t in adv} == {1, 2, 3, 4}
    moved = next(t for t in adv if t.params["moved"])
    assert (
        app_for_task(moved).layout_hash()
        != generate_app(moved.params["level"], 160, 160, moved.seed, attempt=moved.params["attempt"]).layout_hash()
    )


def test_shipped_config_holds_out_whole_layouts():
    env = load_config(Path(__file__).resolve().parents[3] / "configs" / "gui-cpu.yaml").env
    train = build_split(env, "train")
    train_layouts = {app_for_task(train[i]).layout_hash() for i in range(3000)}
    for name in ("holdout", "adversarial"):
        tasks = list(build_split(env, name))
        assert len(tasks) == getattr(env, name).count and train_overlap(tasks) == []
        apps = [app_for_task(t) for t in tasks]
        assert len({(a.content_hash(), t.params["theme"]) for a, t in zip(apps, tasks)}) == len(tasks)
        assert not {a.layout_hash() for a in apps} & train_layouts


def test_held_out_tasks_are_distinct_and_splits_deterministic():
    holdout = build_split(CONFIG, "holdout")
    hashes = [app_for_task(t).content_hash() for t in holdout]
    assert len(set(hashes)) == len(hashes)
    assert [t.to_json() for t in build_split(CONFIG, "holdout")] == [t.to_json() for t in holdout]
    v = split_version(CONFIG, "holdout")
    assert v == split_version(CONFIG, "holdout") and len(v) == 12
    assert v != split_version(CONFIG.model_copy(update={"levels": [1]}), "holdout")


def test_moved_variant_is_off_grid():
    app = apply_moved(generate_app(1, 96, 96, 3), 3)
    assert any(w.box[0] % 16 or w.box[1] % 16 for w in app.screens[0].widgets)


def _hand_written(tabs_back: bool, save_on_second: bool) -> dict:
    """Two screens: `Home` (a tab to `More`, Save) and `More` (a toggle; a tab back if `tabs_back`)."""
    more = [{"id": "t", "kind": "toggle", "label": "Sync", "box": [8, 40, 120, 56], "value": False}]
    if tabs_back:
        more.append({"id": "back", "kind": "tab", "label": "Home", "box": [8, 16, 60, 32], "target": 0})
    if save_on_second:
        more.append(
            {
                "id": "save2",
                "kind": "button",
                "label": "Save",
                "box": [70, 100, 120, 116],
                "action": "save",
                "style": "accent",
            }
        )
    home = [
        {"id": "go", "kind": "tab", "label": "More", "box": [60, 16, 120, 32], "target": 1},
        {
            "id": "save",
            "kind": "button",
            "label": "Save",
            "box": [70, 100, 120, 116],
            "action": "save",
            "style": "accent",
        },
    ]
    return {
        "format": "vlrl.gui.app/1",
        "generator": "hand",
        "level": 4,
        "seed": 0,
        "variant": "none",
        "width": 128,
        "height": 128,
        "title": "Hand",
        "start_screen": 0,
        "goal": {"set": {"t": True}},
        "screens": [{"name": "Home", "widgets": home}, {"name": "More", "widgets": more}],
    }


def test_oracle_follows_tabs_back_to_save_in_hand_written_apps():
    app = App.from_json(_hand_written(tabs_back=True, save_on_second=False))
    state = AppState.initial(app)
    actions = plan(app, state, stop_required=False)
    assert [a.kind for a in actions] == ["click"] * 4 and len(actions) == bfs_distance(
        app, state
    )  # More, Sync, Home, Save
    dead_end = App.from_json(
        _hand_written(tabs_back=False, save_on_second=False)
    )  # valid JSON, but no way back to Save
    state = AppState.initial(dead_end)
    click(dead_end, state, dead_end.widget("go"))
    assert plan(dead_end, state) == [Action("stop")]


def test_a_goal_the_tabs_cannot_reach_is_refused():
    data = _hand_written(tabs_back=True, save_on_second=True)
    data["screens"][0]["widgets"] = data["screens"][0]["widgets"][1:]  # no tab from Home to More
    with pytest.raises(VlrlError, match="no tabs lead from the start screen to 't'"):
        App.from_json(data)
