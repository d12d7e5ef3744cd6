"""The gui env: action parsing, feedback, rewards, stop rules, metrics, traces and their replay."""

from __future__ import annotations

import copy
import json

import pytest

from vlrl.envs import make_env, replay_trace
from vlrl.envs.base import task_group
from vlrl.envs.gui.actions import Action, format_action, parse_action
from vlrl.envs.gui.app import instruction
from vlrl.envs.gui.config import GuiEnvConfig
from vlrl.envs.gui.env import (
    ACTION_CHOICES,
    INVALID_FEEDBACK,
    MISS_FEEDBACK,
    NO_FOCUS_FEEDBACK,
    OUT_OF_TURNS_FEEDBACK,
    OUTSIDE_FEEDBACK,
    STOP_DONE_FEEDBACK,
    STOP_NOT_DONE_FEEDBACK,
)
from vlrl.envs.gui.splits import adhoc_task
from vlrl.errors import VlrlError


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<action>click(12, 40)</action>", Action("click", 12, 40)),
        ("<action> CLICK( 3 ,4 ) </action>", Action("click", 3, 4)),
        ("<action>click(-5, 400)</action>", Action("click", -5, 400)),
        ('<action>type("Paris")</action>', Action("type", text="Paris")),
        ('<action>type("say \\"hi\\"")</action>', Action("type", text='say "hi"')),
        ("<action>Stop</action>", Action("stop")),
        ("<action>stop</action> <action>click(1, 2)</action>", Action("click", 1, 2)),  # the last tag counts
        ("<action>click(12)</action>", None),
        ("<action>type(</action>", None),
        ("<action>click(1.5, 2)</action>", None),
        ('<action>type("' + "x" * 25 + '")</action>', None),
        ("click(1, 2)", None),
        ("<action>press Save</action>", None),
        ("", None),
    ],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_format_action_round_trips():
    for action in (Action("click", 5, 9), Action("type", text='a"b\\c'), Action("stop")):
        assert parse_action(f"<action>{format_action(action)}</action>") == action


def _env(level=2, seed=4, size=160, **kw):
    config = GuiEnvConfig(levels=[level], width=size, height=size, **kw)
    env = make_env(config)
    obs = env.reset(adhoc_task(level, seed, width=size, height=size))
    return env, obs


def test_first_observation_says_task_and_screen_size():
    env, obs = _env(level=2)
    assert obs.text.startswith(instruction(env.app)) and obs.text.endswith(ACTION_CHOICES)
    assert "The screen is 160x160 pixels." in obs.text
    assert len(obs.images) == 1 and obs.images[0].size == (160, 160)


def test_invalid_outside_no_focus_and_miss_feedback():
    env, _ = _env(level=3, rewards={"invalid_action": -0.5, "misclick": -0.2})
    r = env.step("<action>click(12)</action>")
    assert r.info["feedback"] == INVALID_FEEDBACK and r.reward == -0.5 and not r.info["valid"]
    r = env.step("<action>click(160, 3)</action>")
    assert r.info["feedback"] == OUTSIDE_FEEDBACK.format(x=160, y=3, width=160, height=160) and r.reward == -0.5
    r = env.step('<action>type("x")</action>')
    assert r.info["feedback"] == NO_FOCUS_FEEDBACK and r.reward == -0.5
    r = env.step("<action>click(1, 100)</action>")  # the left margin: no widget there
    assert r.info["feedback"] == MISS_FEEDBACK.format(x=1, y=100) and r.reward == -0.2 and r.info["valid"]
    m = env.episode_metrics()
    assert (m["invalid_actions"], m["misclicks"], m["turns"]) == (3.0, 1.0, 4.0)


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_oracle_episode_succeeds_in_optimal_turns(level):
    env, _ = _env(level=level, seed=7, rewards={"subgoal": 0.25})
    while True:
        r = env.step(env.oracle_response())
        if r.done:
            break
    m = env.episode_metrics()
    assert r.info["feedback"] == STOP_DONE_FEEDBACK
    assert m["success"] == 1.0 and m["turns"] == m["optimal_turns"]
    changes = 1 if level == 1 else len(env.app.goal["set"])
    # shaping telescopes: subgoal x (final potential - initial potential) = 0.25 x (changes + 1 [goal])
    expected_shaping = 0.25 * (1 if level == 1 else changes + 1)
    assert m["return"] == pytest.approx(1.0 + expected_shaping)


def test_stop_before_the_goal_fails():
    env, _ = _env(level=2)
    r = env.step("<action>stop</action>")
    assert r.done and r.info["feedback"] == STOP_NOT_DONE_FEEDBACK and r.reward == 0.0
    with pytest.raises(VlrlError, match="finished episode"):
        env.step("<action>stop</action>")


def test_without_stop_the_episode_ends_when_the_goal_holds():
    env, _ = _env(level=1, stop_required=False)
    r = env.step(env.oracle_response())
    assert r.done and r.reward == 1.0 and env.episode_metrics()["optimal_turns"] == 1.0


def test_out_of_turns():
    env, _ = _env(level=2, max_turns=2)
    env.step("<action>click(1, 100)</action>")
    r = env.step("<action>click(1, 100)</action>")
    assert r.done and r.info["truncated"] and r.info["feedback"].endswith(OUT_OF_TURNS_FEEDBACK)


def test_task_group_is_the_level():
    assert task_group(adhoc_task(3, 0, width=160, height=160)) == "level 3"


def test_trace_replays_and_detects_tampering():
    env, _ = _env(level=4, seed=2, max_turns=16)
    env.step("<action>click(1, 100)</action>")
    for _ in range(10):
        r = env.step(env.oracle_response())
        if r.done:
            break
    trace = json.loads(json.dumps(env.trace()))
    assert trace["format"] == "vlrl.gui.trace/1" and trace["success"]
    out = replay_trace(trace)
    assert out["matches"] and out["success"] and out["turns"] == len(trace["turns"])
    forged = copy.deepcopy(trace)
    forged["turns"][0]["response"] = "<action>stop</action>"
    out = replay_trace(forged)
    assert not out["matches"] and not out["success"]
    bad = copy.deepcopy(trace)
    bad["app"]["screens"][0]["widgets"][0]["kind"] = "slider"
    with pytest.raises(VlrlError, match="unknown widget kind"):
        replay_trace(bad)


def test_step_before_reset():
    env = make_env(GuiEnvConfig())
    with pytest.raises(VlrlError, match="before reset"):
        env.step("<action>stop</action>")
