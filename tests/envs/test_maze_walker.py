"""The depth-first walker, the maze's imperfect demonstrator (train.sft.demonstrator)."""

from __future__ import annotations

import random

import pytest

from vlrl.config import load_config
from vlrl.envs.base import Task, build_split, make_env
from vlrl.envs.maze.oracle import distances_to
from vlrl.envs.maze.splits import maze_for_task
from vlrl.envs.maze.walker import FIXED_ORDER, DfsWalker, preferred_order, walk
from vlrl.errors import VlrlError


def _tasks(path: str, overrides: list[str], n: int) -> tuple[list[Task], object]:
    env = load_config(path, overrides).env
    split = build_split(env, "holdout")
    return [split[i] for i in range(n)], env


@pytest.mark.parametrize("stochastic", [False, True])
def test_the_walker_finds_every_goal_given_the_turns_and_never_bumps(stochastic):
    tasks, _ = _tasks("configs/gpu-maze9.yaml", [], 60)
    for task in tasks:
        maze = maze_for_task(task)
        walker = DfsWalker.for_maze(maze, random.Random(task.seed) if stochastic else None)
        pos, turns = maze.start, 0
        while (move := walker.action(pos)) != "stop":
            nxt = maze.move(pos, move)
            assert nxt is not None, f"the walker walked into a wall at {pos}"
            pos, turns = nxt, turns + 1
        # a depth-first walk of a perfect maze: at the goal, in at most two moves per free square
        assert pos == maze.goal and turns <= 2 * len(maze.free_squares())
        assert turns >= distances_to(maze, maze.goal)[maze.start[0]][maze.start[1]]


def test_the_walker_is_deterministic_and_walker_random_varies_with_its_rng():
    tasks, env = _tasks("configs/gpu-maze9.yaml", [], 40)
    mazes = [maze_for_task(t) for t in tasks]
    assert all(preferred_order(m) == preferred_order(m) for m in mazes)
    orders = {preferred_order(mazes[0], random.Random(s)) for s in range(20)}
    assert len(orders) > 1
    assert all(set(o) == {"up", "down", "left", "right"} for o in orders)
    # the two moves towards the goal come first (corners placement: the goal is diagonally opposite)
    m = mazes[0]
    dr, dc = m.goal[0] - m.start[0], m.goal[1] - m.start[1]
    towards = {"down" if dr > 0 else "up", "right" if dc > 0 else "left"}
    assert set(preferred_order(m)[:2]) == towards


def test_the_walker_solves_about_half_the_reference_mazes_in_18_turns():
    """Measured on 500 holdout mazes (README of bench/results/2026-12-03-cpu-demo-demonstrator): walker
    47.8%, walker_random 43.8%, the oracle 93.8%. Here 200 of them, with a margin."""
    tasks, env = _tasks("configs/gpu-maze9.yaml", [], 200)
    rate = sum(walk(maze_for_task(t), env.max_turns, None, env.stop_required) for t in tasks) / len(tasks)
    assert 0.38 <= rate <= 0.58, rate


def test_the_env_plays_its_demonstrator_and_refuses_unknown_names():
    tasks, env_config = _tasks("configs/demo-cpu.yaml", [], 3)
    env = make_env(env_config)
    with pytest.raises(VlrlError, match="before reset"):
        env.start_demonstrator("walker", random.Random(0))
    env.reset(tasks[0])
    with pytest.raises(VlrlError, match="before start_demonstrator"):
        env.demonstrator_response()
    with pytest.raises(VlrlError, match="did you mean 'walker'"):
        env.start_demonstrator("walkr", random.Random(0))
    env.start_demonstrator("walker", random.Random(0))
    maze = maze_for_task(tasks[0])
    expected = DfsWalker.for_maze(maze)
    pos = maze.start
    for _ in range(env_config.max_turns):
        response = env.demonstrator_response()
        move = expected.action(pos)
        assert response == f"<action>{move}</action>"
        result = env.step(response)
        if result.done:
            break
        pos = maze.move(pos, move)


@pytest.mark.parametrize("stochastic", [False, True])
def test_the_walker_goes_on_from_wherever_noisy_turns_leave_the_agent(stochastic):
    """SFT noise (train.sft.noise) plays random moves the walker did not choose, sometimes several in a
    row: the walker must go on from the agent's real cell, never into a wall, and still find the goal
    (once it kept a way back with a gap in it, and backtracking across the gap raised StopIteration)."""
    tasks, _ = _tasks("configs/gpu-maze9.yaml", [], 150)
    for task in tasks:
        maze, rng = maze_for_task(task), random.Random(task.seed)
        walker = DfsWalker.for_maze(maze, random.Random(task.seed) if stochastic else None)
        pos, stopped = maze.start, False
        for _ in range(400):
            if rng.random() < 0.4:  # a noisy turn: a random move, the walker not asked
                pos = maze.move(pos, rng.choice(FIXED_ORDER)) or pos
                continue
            move = walker.action(pos)
            if move == "stop":
                assert pos == maze.goal
                stopped = True
                break
            nxt = maze.move(pos, move)
            assert nxt is not None, f"the walker walked into a wall at {pos}"
            pos = nxt
        assert stopped, f"the walker did not find the goal of task {task.seed} in 400 turns"


def test_the_order_seen_from_another_cell_faces_the_goal_from_there():
    tasks, _ = _tasks("configs/gpu-maze9.yaml", [], 1)
    m = maze_for_task(tasks[0])
    assert preferred_order(m, at=m.start) == preferred_order(m)
    # from the goal's own row, left of it, "right" is the only move towards it
    at = (m.goal[0], m.goal[1] - 1) if m.goal[1] > 0 else (m.goal[0], m.goal[1] + 1)
    assert preferred_order(m, at=at)[0] == ("right" if at[1] < m.goal[1] else "left")


def test_walk_plays_the_walker_it_is_given():
    tasks, env = _tasks("configs/gpu-maze9.yaml", [], 20)
    mazes = [maze_for_task(t) for t in tasks]
    played = []

    class Recording(DfsWalker):
        def action(self, pos):
            played.append(pos)
            return super().action(pos)

    for m in mazes:
        assert walk(m, env.max_turns, None, env.stop_required, walker=Recording.for_maze(m)) == walk(
            m, env.max_turns, None, env.stop_required
        )
    assert played


def test_the_blind_walker_keeps_one_order_and_is_weaker_than_the_goal_facing_one():
    """`walker_blind` ignores the goal: the same order (up, right, down, left) in every maze. On the CPU
    demo's 3x3 mazes at 6 turns it solves 55.25% of the first 400 holdout mazes, the goal-facing walker
    71.5% (bench/results/2026-12-07-cpu-demo-volume-bound/). Here 200, with a margin."""
    tasks, env_config = _tasks("configs/demo-cpu.yaml", [], 200)
    mazes = [maze_for_task(t) for t in tasks]
    assert all(DfsWalker.named("walker_blind", m, random.Random(i)).order == FIXED_ORDER for i, m in enumerate(mazes))
    assert DfsWalker.named("walker", mazes[0], random.Random(0)).order == preferred_order(mazes[0])
    with pytest.raises(ValueError, match="no walker named 'walker_blnd'"):
        DfsWalker.named("walker_blnd", mazes[0], random.Random(0))
    blind = sum(
        walk(m, env_config.max_turns, walker=DfsWalker.named("walker_blind", m, random.Random(0))) for m in mazes
    )
    facing = sum(walk(m, env_config.max_turns) for m in mazes)
    assert 0.45 <= blind / len(mazes) <= 0.65 < facing / len(mazes), (blind, facing)
    env = make_env(env_config)
    env.reset(tasks[0])
    env.start_demonstrator("walker_blind", random.Random(0))
    first = DfsWalker(mazes[0], FIXED_ORDER).action(mazes[0].start)
    assert env.demonstrator_response() == f"<action>{first}</action>"
