"""The multi-turn maze env and the plan variant: rules, rewards, metrics, traces."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlrl.envs import make_env, replay_trace
from vlrl.envs.maze.config import MazeEnvConfig, RewardConfig
from vlrl.envs.maze.env import (
    INSTRUCTION,
    INVALID_FEEDBACK,
    LOST_FEEDBACK,
    OUT_OF_TURNS_FEEDBACK,
    PLAN_INVALID_FEEDBACK,
    PROMPT_TEXTS,
    WALL_FEEDBACK,
    parse_action,
    parse_plan,
)
from vlrl.envs.maze.maze import MOVES
from vlrl.envs.maze.oracle import optimal_actions
from vlrl.envs.maze.rewards import max_return
from vlrl.envs.maze.splits import adhoc_task
from vlrl.errors import VlrlError


def _env(name="maze", **kw):
    config = MazeEnvConfig(name=name, **kw)
    env = make_env(config)
    return env


def _started(name="maze", size=5, seed=0, **kw):
    env = _env(name, **kw)
    obs = env.reset(adhoc_task(size, seed, env=name))
    return env, obs


def _wall_move(env) -> str:
    return next(m for m in MOVES if env.maze.move(env.pos, m) is None)


def _away_move(env) -> str:
    """A legal move that increases the distance to the goal."""
    d = env.dist
    for m in MOVES:
        nxt = env.maze.move(env.pos, m)
        if nxt is not None and d[nxt[0]][nxt[1]] > d[env.pos[0]][env.pos[1]]:
            return m
    raise AssertionError("no move away")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<action>right</action>", "right"),
        ("<ACTION> Up </Action>", "up"),
        ("think... <action>left</action> no wait <action>down</action>", "down"),
        ("<action>down</action><action>jump</action>", None),  # the last tag counts, even if bad
        ("<action>\n stop \n</action>", "stop"),
        ("right", None),
        ("", None),
        ("<action>move right</action>", None),
        ("<action>right", None),
    ],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>right down down</answer>", ["right", "down", "down"]),
        ("<answer> Right,Down , up </answer>", ["right", "down", "up"]),
        ("<answer>up</answer> then <answer>left left</answer>", ["left", "left"]),
        ("<answer></answer>", None),
        ("<answer>right stop</answer>", None),
        ("right down", None),
    ],
)
def test_parse_plan(text, expected):
    assert parse_plan(text) == expected


def test_first_observation_and_texts():
    env, obs = _started()
    assert obs.text == INSTRUCTION and len(obs.images) == 1
    assert obs.images[0].size == (125, 125)
    assert WALL_FEEDBACK["right"] == "Cannot move right into a wall."
    # Every text the env shows is one of PROMPT_TEXTS: a wall bump, an invalid answer, a move, a stop.
    shown = {obs.text}
    open_move = next(m for m in MOVES if env.maze.move(env.pos, m) is not None)
    for reply in (
        f"<action>{_wall_move(env)}</action>",
        "no action",
        f"<action>{open_move}</action>",
        "<action>stop</action>",
    ):
        shown.add(env.step(reply).info["feedback"])
    assert INVALID_FEEDBACK in shown and shown <= set(PROMPT_TEXTS), shown - set(PROMPT_TEXTS)


def test_wall_bump_keeps_position():
    env, obs = _started()
    start = env.pos
    move = _wall_move(env)
    result = env.step(f"<action>{move}</action>")
    assert (
        result.info["bumped"] and result.info["feedback"] == WALL_FEEDBACK[move] == f"Cannot move {move} into a wall."
    )
    assert result.observation.text == WALL_FEEDBACK[move]
    assert env.pos == start and not result.done
    assert env.episode_metrics()["wall_bumps"] == 1


def test_invalid_output():
    env, _ = _started()
    result = env.step("I think I should go right")
    assert result.info["valid"] is False and result.info["action"] is None
    assert result.observation.text == INVALID_FEEDBACK
    assert env.episode_metrics()["invalid_actions"] == 1


def test_move_gives_feedback_and_new_image():
    env, obs = _started()
    move = optimal_actions(env.maze, env.pos, env.maze.goal)[0]
    result = env.step(f"<action>{move}</action>")
    assert result.observation.text == f"Moved {move}."
    assert result.observation.images[0].tobytes() != obs.images[0].tobytes()


def test_max_turns_ends_without_success():
    env, _ = _started(max_turns=3)
    results = [env.step("<action>" + _wall_move(env) + "</action>") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].observation is None and results[-1].info["truncated"]
    assert OUT_OF_TURNS_FEEDBACK in results[-1].info["feedback"]
    assert env.episode_metrics()["success"] == 0.0
    with pytest.raises(VlrlError, match="finished"):
        env.step("<action>stop</action>")


def _slack(env) -> int:
    """Turns left minus the turns optimal play still needs (stop included)."""
    return env.config.max_turns - len(env.turns) - env._turns_needed()


@pytest.mark.parametrize("stop_required", [True, False])
def test_end_when_lost_ends_on_the_turn_the_goal_goes_out_of_reach(stop_required):
    # Same maze and the same moves twice: with end_when_lost the episode ends on the first turn
    # after which the goal cannot be reached in the turns left; without it, it runs to max_turns.
    # Success is 0 both times, and every turn before the end is identical.
    runs = {}
    for on in (False, True):
        env, _ = _started(size=9, seed=0, layout="blocks", max_turns=20, stop_required=stop_required, end_when_lost=on)
        slack = [_slack(env)]
        assert slack[0] >= 3  # winnable at the start, with room for a few moves away
        results = []
        while not env.done:
            move = (
                _away_move(env)
                if any(
                    (n := env.maze.move(env.pos, m)) is not None and env.dist[n[0]][n[1]] > env._distance()
                    for m in MOVES
                )
                else _wall_move(env)
            )
            results.append(env.step(f"<action>{move}</action>"))
            slack.append(_slack(env))
        runs[on] = (env, results, slack)
    off_env, off_results, off_slack = runs[False]
    on_env, on_results, on_slack = runs[True]
    assert off_env.episode_metrics()["success"] == on_env.episode_metrics()["success"] == 0.0
    assert len(off_env.turns) == 20 and off_results[-1].info["truncated"]
    lost_at = next(i for i, s in enumerate(off_slack[1:]) if s < 0)  # the first turn after which it is out of reach
    assert len(on_env.turns) == lost_at + 1 < 20
    assert on_results[-1].done and on_results[-1].info["lost"] and not on_results[-1].info["truncated"]
    assert on_results[-1].observation is None and LOST_FEEDBACK in on_results[-1].info["feedback"]
    assert not any(r.info["lost"] for r in on_results[:-1]) and not any(r.info["lost"] for r in off_results)
    assert [t["position"] for t in on_env.turns] == [t["position"] for t in off_env.turns[: lost_at + 1]]
    assert all(s >= 0 for s in on_slack[:-1]) and on_slack[-1] < 0
    assert on_env.episode_metrics()["lost"] == 1.0 and "lost" not in off_env.episode_metrics()


def test_end_when_lost_keeps_winning_play_and_ends_an_out_of_reach_maze_at_once():
    # The oracle within the limit wins as before; a maze that needs more turns than max_turns
    # ends after its first turn (and replays from its trace); the spec records the rule only when on.
    env, _ = _started(size=9, seed=0, layout="blocks", end_when_lost=True, max_turns=50)
    while not env.step(env.oracle_response()).done:
        pass
    assert env.success and len(env.turns) == env.optimal_turns() and env.episode_metrics()["lost"] == 0.0
    env, _ = _started(size=9, seed=0, layout="blocks", end_when_lost=True, max_turns=5)
    result = env.step(env.oracle_response())
    assert result.done and result.info["lost"] and not env.success and len(env.turns) == 1
    trace = json.loads(json.dumps(env.trace()))
    assert trace["settings"]["end_when_lost"] is True
    check = replay_trace(trace)
    assert check["matches"] and check["turns"] == 1, check["problems"]
    forged = copy.deepcopy(trace)
    del forged["settings"]["end_when_lost"]  # replayed without the rule, the episode would not have ended
    assert not replay_trace(forged)["matches"]
    assert "end_when_lost" not in _started(size=5)[0].trace()["settings"]
    cls = type(env)
    assert cls.reward_spec(env.config)["end_when_lost"] is True
    assert "end_when_lost" not in cls.reward_spec(MazeEnvConfig(name="maze"))


def test_reaching_goal_without_stop_is_not_success_when_stop_required():
    env, _ = _started(max_turns=50)
    for move in optimal_actions(env.maze, env.pos, env.maze.goal):
        result = env.step(f"<action>{move}</action>")
    assert not result.done and env.pos == env.maze.goal
    assert env.step("<action>stop</action>").info["success"]


def test_stop_off_goal_fails():
    env, _ = _started()
    result = env.step("<action>stop</action>")
    assert result.done and result.observation is None and not result.info["success"]
    assert result.reward == 0.0 and env.episode_metrics()["success"] == 0.0


def test_stop_not_required():
    env, _ = _started(stop_required=False)
    moves = optimal_actions(env.maze, env.pos, env.maze.goal)
    for i, move in enumerate(moves):
        result = env.step(f"<action>{move}</action>")
        assert result.done == (i == len(moves) - 1)
    assert result.info["success"] and result.reward == 1.0
    assert env.episode_metrics()["optimal_turns"] == len(moves) == env.episode_metrics()["turns"]
    env2, _ = _started(stop_required=False)
    r = env2.step("<action>stop</action>")
    assert r.done and not r.info["success"]


def test_each_reward_term():
    rewards = RewardConfig(success=2.0, progress=0.5, invalid_action=-0.3, wall_bump=-0.2, step_cost=-0.01)
    env, _ = _started(rewards=rewards.model_dump())
    assert env.step("junk").reward == pytest.approx(-0.3 - 0.01)
    assert env.step(f"<action>{_wall_move(env)}</action>").reward == pytest.approx(-0.2 - 0.01)
    first = optimal_actions(env.maze, env.pos, env.maze.goal)[0]
    assert env.step(f"<action>{first}</action>").reward == pytest.approx(0.5 - 0.01)
    assert env.step(f"<action>{_away_move(env)}</action>").reward == pytest.approx(-0.5 - 0.01)
    for move in optimal_actions(env.maze, env.pos, env.maze.goal):
        env.step(f"<action>{move}</action>")
    assert env.step("<action>stop</action>").reward == pytest.approx(2.0 - 0.01)
    total = sum(t["reward"] for t in env.trace()["turns"])
    assert env.episode_metrics()["return"] == pytest.approx(total)


reward_configs = st.builds(
    RewardConfig,
    success=st.floats(0.5, 2.0),
    progress=st.floats(0.0, 0.5),
    invalid_action=st.floats(-1.0, 0.0),
    wall_bump=st.floats(-1.0, 0.0),
    step_cost=st.floats(-0.02, 0.0),
)


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(3, 13),
    seed=st.integers(0, 2**32),
    rewards=reward_configs,
    stop_required=st.booleans(),
    plan=st.booleans(),
)
def test_oracle_play_scores_the_maximum(size, seed, rewards, stop_required, plan):
    name = "maze_plan" if plan else "maze"
    env = make_env(MazeEnvConfig(name=name, max_turns=256, stop_required=stop_required, rewards=rewards))
    env.reset(adhoc_task(size, seed, env=name))
    d = env.dist[env.maze.start[0]][env.maze.start[1]]
    done = False
    while not done:
        done = env.step(env.oracle_response()).done
    m = env.episode_metrics()
    assert m["success"] == 1.0 and m["turns"] == m["optimal_turns"]
    assert m["optimal_turns"] == d + (1 if stop_required and not plan else 0)
    assert m["return"] == pytest.approx(max_return(rewards, d, stop_required, plan=plan))
    assert m["invalid_actions"] == m["wall_bumps"] == 0


def test_plan_variant_scoring():
    rewards = RewardConfig(success=1.0, progress=0.1, invalid_action=-0.5, wall_bump=-0.05)
    env, obs = _started("maze_plan", rewards=rewards.model_dump())
    assert "<answer>" in obs.text and env.system_prompt != _env().system_prompt
    path = optimal_actions(env.maze, env.maze.start, env.maze.goal)
    assert env.oracle_response() == "<answer>" + " ".join(path) + "</answer>"
    d = len(path)
    result = env.step(env.oracle_response())
    assert result.done and result.observation is None and result.info["success"]
    assert result.reward == pytest.approx(1.0 + 0.1 * d)

    # partial progress: the first half of the path, plus one bump
    env, _ = _started("maze_plan", rewards=rewards.model_dump())
    wall = _wall_move(env)
    half = path[: d // 2]
    result = env.step("<answer>" + " ".join([wall] + half) + "</answer>")
    assert not result.info["success"] and result.info["bumps"] == 1
    assert result.reward == pytest.approx(0.1 * len(half) - 0.05)
    assert env.episode_metrics()["turns"] == len(half) + 1

    # passing over the goal and walking on does not count
    env, _ = _started("maze_plan", rewards=rewards.model_dump())
    back = {"up": "down", "down": "up", "left": "right", "right": "left"}[path[-1]]
    result = env.step("<answer>" + " ".join(path + [back]) + "</answer>")
    assert not result.info["success"] and result.reward == pytest.approx(0.1 * (d - 1))

    env, _ = _started("maze_plan", rewards=rewards.model_dump())
    result = env.step("right down")
    assert not result.info["valid"] and result.info["feedback"] == PLAN_INVALID_FEEDBACK
    assert result.reward == pytest.approx(-0.5) and env.episode_metrics()["invalid_actions"] == 1


def test_metrics_keys_and_solvable():
    env, _ = _started(size=9, seed=0, max_turns=5)
    m = env.episode_metrics()
    for key in ("success", "turns", "invalid_actions", "wall_bumps", "optimal_turns", "return", "solvable"):
        assert isinstance(m[key], float)
    assert m["solvable"] == 0.0  # a 9x9 corner maze needs at least 17 turns


def test_trace_is_json_and_replays():
    rewards = RewardConfig(progress=0.1, wall_bump=-0.1, invalid_action=-0.2, step_cost=-0.01)
    env, _ = _started(rewards=rewards.model_dump())
    env.step("junk")
    env.step(f"<action>{_wall_move(env)}</action>")
    while True:
        if env.step(env.oracle_response()).done:
            break
    trace = json.loads(json.dumps(env.trace()))
    assert trace["turns"][0]["response"] == "junk" and trace["turns"][0]["action"] is None
    assert trace["maze"]["size"] == 5 and trace["success"] is True
    check = replay_trace(trace)
    assert check["matches"], check["problems"]
    assert check["success"] is True and check["return"] == pytest.approx(env.episode_metrics()["return"])

    forged = copy.deepcopy(trace)
    forged["turns"][0]["response"] = "<action>stop</action>"  # the episode would have ended at once
    check = replay_trace(forged)
    assert not check["matches"] and check["success"] is False
    forged = copy.deepcopy(trace)
    forged["return"] = 5.0
    assert not replay_trace(forged)["matches"]
    forged = copy.deepcopy(trace)
    forged["maze"]["open"][0][0] = ""
    with pytest.raises(VlrlError):
        replay_trace(forged)


def test_plan_trace_replays():
    env, _ = _started("maze_plan")
    env.step(env.oracle_response())
    check = replay_trace(json.loads(json.dumps(env.trace())))
    assert check["matches"] and check["success"] and check["return"] == 1.0


def test_reset_rejects_foreign_task_and_step_before_reset():
    from vlrl.envs import Task

    env = _env()
    with pytest.raises(VlrlError, match="before reset"):
        env.step("<action>up</action>")
    with pytest.raises(VlrlError, match="before reset"):
        env.episode_metrics()
    with pytest.raises(VlrlError, match="not a maze"):
        env.reset(Task("sokoban", "train", 0, 0, {}))
    with pytest.raises(VlrlError, match="lacks"):
        env.reset(Task("maze", "train", 0, 0, {"size": 5}))


@pytest.mark.parametrize("layout, size", [("blocks", 9), ("cells", 5)])
def test_look_variant_names_the_open_moves(layout, size):
    rewards = RewardConfig(success=1.0, invalid_action=-0.5)
    for seed in range(8):
        env = _env("maze_look", layout=layout, placement="random", rewards=rewards.model_dump())
        obs = env.reset(adhoc_task(size, seed, env="maze_look", layout=layout, placement="random"))
        assert len(obs.images) == 1 and "<answer>" in obs.text
        open_moves = [m for m in MOVES if env.maze.move(env.pos, m) is not None]
        assert env.oracle_response() == "<answer>" + " ".join(open_moves) + "</answer>"
        # any order counts; the set must be exact
        result = env.step("<answer>" + " ".join(reversed(open_moves)) + "</answer>")
        assert result.done and result.observation is None and result.info["success"] and result.reward == 1.0
        m = env.episode_metrics()
        assert m["turns"] == 1.0 and m["optimal_turns"] == 1.0 and m["success"] == 1.0

        env.reset(adhoc_task(size, seed, env="maze_look", layout=layout, placement="random"))
        blocked = [m for m in MOVES if m not in open_moves]
        wrong = open_moves[:-1] + blocked[:1] if blocked else open_moves[:-1]
        result = env.step("<answer>" + " ".join(wrong) + "</answer>")
        assert result.info["valid"] and not result.info["success"] and result.reward == 0.0

    for bad in ("up left", "<answer>up up</answer>", "<answer></answer>", "<answer>north</answer>"):
        env, _ = _started("maze_look", rewards=rewards.model_dump())
        result = env.step(bad)
        assert not result.info["valid"] and result.reward == -0.5 and env.episode_metrics()["invalid_actions"] == 1


def test_look_trace_replays_and_random_responses_parse():
    import random

    env, _ = _started("maze_look", placement="random")
    env.step(env.oracle_response())
    trace = json.loads(json.dumps(env.trace()))
    assert trace["env"] == "maze_look"
    check = replay_trace(trace)
    assert check["matches"] and check["success"] and check["return"] == 1.0
    forged = copy.deepcopy(trace)
    forged["turns"][0]["response"] = "<answer>up down left right</answer>"
    assert not replay_trace(forged)["matches"]
    rng = random.Random(0)
    for _ in range(20):
        env, _ = _started("maze_look")
        assert env.step(env.random_response(rng)).info["valid"]


@pytest.mark.parametrize("layout, size", [("blocks", 9), ("cells", 3)])
def test_legal_responses_are_the_moves_no_wall_blocks(layout, size):
    for seed in range(8):
        task = adhoc_task(size, seed, layout=layout)
        env = _env(layout=layout)
        env.reset(task)
        legal = env.legal_responses()
        assert legal and all(parse_action(r) in MOVES for r in legal)
        for move in MOVES:
            env.reset(task)
            bumped = env.step(f"<action>{move}</action>").info["bumped"]
            assert bumped == (f"<action>{move}</action>" not in legal)
    assert make_env(MazeEnvConfig(name="maze_plan")).lists_legal_responses() is False
    assert _env().lists_legal_responses() is True
