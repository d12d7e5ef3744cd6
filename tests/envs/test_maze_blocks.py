"""The block layout (the reference maze): generation, rendering, oracle, JSON, env, splits, CLI."""

from __future__ import annotations

import copy
import json
from collections import Counter, deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner

from vlrl.cli.env_cmd import app
from vlrl.config import load_config
from vlrl.envs import build_split, make_env, overlapping_tasks, replay_trace, split_version
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.envs.maze.env import WALL_FEEDBACK
from vlrl.envs.maze.generate import generate_maze
from vlrl.envs.maze.maze import MOVES, TRANSFORMS, Maze, check_perfect
from vlrl.envs.maze.oracle import distances_to, next_action, optimal_actions
from vlrl.envs.maze.render import THEMES, ascii_maze, render
from vlrl.envs.maze.splits import adhoc_task, layout_split, maze_bucket, maze_for_task
from vlrl.errors import ConfigError, VlrlError

block_sizes = st.sampled_from([5, 7, 9, 11, 13])
seeds = st.integers(min_value=0, max_value=2**40)
GRAY, WHITE, RED, BLUE = (169, 169, 169), (255, 255, 255), (255, 0, 0), (0, 0, 255)
STEP = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def _free_grid(maze: Maze) -> list[str]:
    """The wall/free grid as written in the JSON (independent of the masks' helpers)."""
    return maze.to_json()["blocks"]


def _bfs(grid: list[str], source: tuple[int, int]) -> dict:
    """Distances over free blocks, moving one block at a time: from the '#'/'.' grid alone."""
    dist, queue = {source: 0}, deque([source])
    while queue:
        r, c = queue.popleft()
        for dr, dc in STEP.values():
            nxt = (r + dr, c + dc)
            if grid[nxt[0]][nxt[1]] == "." and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def _assert_block_perfect(maze: Maze) -> None:
    n, grid = maze.size, _free_grid(maze)
    free = {(r, c) for r in range(n) for c in range(n) if grid[r][c] == "."}
    assert all(grid[0][c] == grid[n - 1][c] == grid[c][0] == grid[c][n - 1] == "#" for c in range(n))  # closed
    assert all((r, c) in free for r in range(1, n, 2) for c in range(1, n, 2))  # every room is free
    assert not any((r, c) in free for r in range(0, n, 2) for c in range(0, n, 2))  # pillars are walls
    edges = {
        frozenset({a, (a[0] + dr, a[1] + dc)})
        for a in free
        for dr, dc in STEP.values()
        if (a[0] + dr, a[1] + dc) in free
    }
    assert len(free) == 2 * ((n - 1) // 2) ** 2 - 1
    assert len(edges) == len(free) - 1  # a tree: connected (below) with free - 1 edges
    assert set(_bfs(grid, maze.start)) == free
    assert maze.start in free and maze.goal in free
    # masks agree with the grid: a free block is open exactly towards its free neighbours
    for r, c in free:
        for move, (dr, dc) in STEP.items():
            assert (maze.move((r, c), move) is not None) == ((r + dr, c + dc) in free)


@settings(max_examples=80, deadline=None)
@given(
    size=block_sizes,
    seed=seeds,
    placement=st.sampled_from(["corners", "random", "off_corner"]),
    transform=st.sampled_from(TRANSFORMS),
)
def test_block_mazes_are_perfect(size, seed, placement, transform):
    maze = generate_maze(size, seed, placement=placement, min_distance=2, layout="blocks", transform=transform)
    if maze is None:
        return
    assert maze.layout == "blocks" and maze.start != maze.goal
    _assert_block_perfect(maze)
    check_perfect(maze)
    hi = size - 2
    rooms = [(1, 1), (1, hi), (hi, 1), (hi, hi)]
    if placement == "corners":  # opposite corner rooms
        assert {maze.start, maze.goal} <= set(rooms) and maze.start[0] != maze.goal[0] and maze.start[1] != maze.goal[1]
    if placement == "off_corner":
        assert maze.start not in rooms and maze.goal not in rooms
    if placement != "corners":
        assert _bfs(_free_grid(maze), maze.start)[maze.goal] >= 2


def test_reference_task_renders_at_225_px():
    maze = generate_maze(9, 3, layout="blocks")
    image = render(maze, maze.start)  # cell_px 25, default theme: the reference look
    assert image.size == (225, 225)
    px = np.asarray(image)
    grid = _free_grid(maze)
    for r in range(9):
        for c in range(9):
            if (r, c) in (maze.start, maze.goal):
                continue
            centre, corner = tuple(px[r * 25 + 12, c * 25 + 12]), tuple(px[r * 25, c * 25])
            assert centre == corner == (GRAY if grid[r][c] == "#" else WHITE)  # whole blocks, no lines
    gr, gc = maze.goal
    ar, ac = maze.start
    assert (px[gr * 25 : (gr + 1) * 25, gc * 25 : (gc + 1) * 25] == RED).all()  # goal: a red square filling its block
    assert tuple(px[ar * 25 + 12, ac * 25 + 12]) == BLUE and tuple(px[ar * 25 + 2, ac * 25 + 2]) == WHITE  # a circle
    assert {maze.start, maze.goal} <= {(1, 1), (1, 7), (7, 1), (7, 7)}
    assert {tuple(c) for c in px.reshape(-1, 3)} == {WHITE, GRAY, RED, BLUE}  # no anti-aliasing
    assert render(maze, maze.start).tobytes() == image.tobytes()
    for theme in THEMES:
        assert render(maze, maze.start, 16, theme, noise_seed=1).size == (144, 144)


def _oracle_moves(size: int, seeds_: range) -> Counter:
    """Shortest-path lengths (moves) of corner-to-corner block mazes, each checked against an independent BFS."""
    lengths: Counter = Counter()
    for seed in seeds_:
        maze = generate_maze(size, seed, layout="blocks")
        actions = optimal_actions(maze, maze.start, maze.goal)
        assert len(actions) == _bfs(_free_grid(maze), maze.start)[maze.goal]
        assert distances_to(maze, maze.goal)[maze.start[0]][maze.start[1]] == len(actions)
        pos = maze.start
        for action in actions:
            pos = maze.move(pos, action)
            assert pos is not None
        assert pos == maze.goal and next_action(maze, pos) == "stop"
        lengths[len(actions)] += 1
    return lengths


def test_oracle_is_optimal_and_the_reference_is_mostly_solvable_in_18_turns():
    # Measured over 20k seeds: 9x9 moves {12: 72%, 16: 22%, 20: 5%, 24: 1%, 28: <0.1%}, so 94% fit in
    # 18 turns (moves + stop); 11x11 {16: 56%, 20: 29%, 24: 11%, ...}, 56% fit.
    nine = _oracle_moves(9, range(400))
    assert min(nine) == 12 and all(d % 4 == 0 for d in nine)  # room paths are even, 2 blocks per room step
    within = sum(v for d, v in nine.items() if d + 1 <= 18) / sum(nine.values())
    assert 0.88 < within < 0.99
    eleven = _oracle_moves(11, range(200))
    assert min(eleven) == 16 and 0.45 < sum(v for d, v in eleven.items() if d + 1 <= 18) / 200 < 0.7


@settings(max_examples=60, deadline=None)
@given(
    size=block_sizes,
    seed=seeds,
    transform=st.sampled_from(TRANSFORMS),
    placement=st.sampled_from(["corners", "random"]),
)
def test_block_json_round_trips_exactly(size, seed, transform, placement):
    maze = generate_maze(size, seed, transform=transform, placement=placement, min_distance=2, layout="blocks")
    if maze is None:
        return
    data = maze.to_json()
    assert data["layout"] == "blocks" and "open" not in data
    again = Maze.from_json(json.loads(json.dumps(data)))
    assert again == maze and again.to_json() == data


def _set(data: dict, r: int, c: int, ch: str) -> dict:
    out = copy.deepcopy(data)
    row = out["blocks"][r]
    out["blocks"][r] = row[:c] + ch + row[c + 1 :]
    return out


def test_block_json_rejects_malformed_and_imperfect():
    maze = generate_maze(9, 3, layout="blocks")
    data = maze.to_json()
    grid = data["blocks"]
    walls = [(r, c) for r in range(1, 8) for c in range(1, 8) if (r + c) % 2 == 1 and grid[r][c] == "#"]
    passages = [(r, c) for r in range(1, 8) for c in range(1, 8) if (r + c) % 2 == 1 and grid[r][c] == "."]
    cases = [
        ({**data, "size": 8}, "odd"),
        ({**data, "layout": "hex"}, "layout"),
        ({**{k: v for k, v in data.items() if k != "blocks"}, "open": []}, "missing"),
        ({**data, "blocks": grid[:-1]}, "strings"),
        (_set(data, 1, 2, "x"), "contains"),
        (_set(data, 0, 3, "."), "outer wall"),
        (_set(data, 2, 2, "."), "even"),
        (_set(data, 3, 3, "#"), "room"),
        (_set(data, *walls[0], "."), "cycle"),  # an extra passage between two connected rooms
        (_set(data, *passages[0], "#"), "not connected"),  # cutting a tree edge
        ({**data, "start": list(walls[0])}, "wall block"),
        ({**data, "goal": [0, 0]}, "wall block"),
    ]
    for bad, message in cases:
        with pytest.raises(VlrlError, match=message):
            Maze.from_json(bad)
    # a thin wall (closed on both sides) between two free blocks is not a block maze
    room = next(
        i for i in range(81) if bin(maze.open[i]).count("1") >= 2 and divmod(i, 9)[0] % 2 == 1 == divmod(i, 9)[1] % 2
    )
    side = next(s for s in (1, 2, 4, 8) if maze.open[room] & s)  # that room and one free neighbour
    neighbour = room + {1: -9, 2: 1, 4: 9, 8: -1}[side]
    masks = list(maze.open)
    masks[room] &= ~side
    masks[neighbour] &= ~{1: 4, 4: 1, 2: 8, 8: 2}[side]
    assert masks[neighbour]  # the passage block is still open towards its other room
    with pytest.raises(VlrlError, match="wall line"):
        check_perfect(Maze(9, tuple(masks), maze.start, maze.goal, layout="blocks"))


def test_cell_json_without_layout_still_reads():
    maze = generate_maze(5, 0)
    data = maze.to_json()
    assert data["layout"] == "cells"
    old = {k: v for k, v in data.items() if k != "layout"}
    assert Maze.from_json(old) == maze
    with pytest.raises(VlrlError, match="unknown key"):
        Maze.from_json({**data, "blocks": []})


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["env.layout=blocks", "env.sizes=[8]"], "env.sizes has 8"),
        (["env.layout=blocks", "env.sizes=[3]"], "env.sizes has 3"),
        (["env.layout=blocks", "env.sizes=[9]", "env.adversarial_variants.extra_sizes=[11, 12]"], "extra_sizes has 12"),
        (["env.layout=blocks", "env.holdout.sizes=[6]"], "env.holdout.sizes has 6"),
        (["env.layout=grid"], "env.layout"),
    ],
)
def test_bad_block_sizes_are_config_errors(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_bad_block_sizes_in_code():
    assert load_config(None, ["env.layout=blocks", "env.sizes=[5, 9, 11]"]).env.layout == "blocks"
    for size in (4, 8, 3, 65):
        with pytest.raises(VlrlError, match="size"):
            generate_maze(size, 0, layout="blocks")
    with pytest.raises(VlrlError, match="odd"):
        adhoc_task(10, 0, layout="blocks")
    with pytest.raises(VlrlError, match="layout"):
        generate_maze(9, 0, layout="hex")


def test_block_generation_is_deterministic_and_pinned():
    assert generate_maze(9, 3, layout="blocks") == generate_maze(9, 3, layout="blocks")
    assert generate_maze(9, 3, layout="blocks").open != generate_maze(9, 4, layout="blocks").open
    assert generate_maze(9, 3, layout="blocks").open != generate_maze(9, 3, attempt=1, layout="blocks").open
    # Bump GENERATOR_VERSION rather than editing these: they pin every block split.
    assert generate_maze(9, 3, layout="blocks").content_hash()[:16] == "9658820eeee23994"
    assert generate_maze(11, 0, layout="blocks").content_hash()[:16] == "76560fd35461bb2b"


def test_block_episode_moves_bumps_trace_and_replay():
    config = MazeEnvConfig(layout="blocks", sizes=[9])
    env = make_env(config)
    task = adhoc_task(9, 5, layout="blocks")
    obs = env.reset(task)
    assert obs.images[0].size == (225, 225)
    wall_move = next(m for m in MOVES if env.maze.move(env.pos, m) is None)
    result = env.step(f"<action>{wall_move}</action>")
    assert (
        result.info["feedback"] == WALL_FEEDBACK[wall_move]
        and result.info["bumped"]
        and list(env.pos) == list(env.maze.start)
    )
    while not env.done:
        result = env.step(env.oracle_response())
    metrics = env.episode_metrics()
    assert (
        metrics["success"] == 1.0 and metrics["wall_bumps"] == 1.0 and metrics["turns"] == metrics["optimal_turns"] + 1
    )
    trace = json.loads(json.dumps(env.trace()))
    assert trace["maze"]["layout"] == "blocks" and trace["task"]["params"]["layout"] == "blocks"
    assert replay_trace(trace)["matches"]
    forged = copy.deepcopy(trace)
    forged["turns"][0]["feedback"] = "Moved up."
    assert not replay_trace(forged)["matches"]
    plan = make_env(MazeEnvConfig(name="maze_plan", layout="blocks", sizes=[9]))
    plan.reset(adhoc_task(9, 5, env="maze_plan", layout="blocks"))
    assert plan.step(plan.oracle_response()).info["success"]


def test_block_splits_are_disjoint_versioned_and_adversarial_variants_work():
    cfg = MazeEnvConfig(
        layout="blocks",
        sizes=[7, 9],
        train={"seed_start": 0, "count": 200},
        holdout={"seed_start": 1000, "count": 40},
        adversarial={"seed_start": 2000, "count": 32},
        adversarial_variants={"extra_sizes": [11]},
    )
    train, holdout, adversarial = (build_split(cfg, s) for s in ("train", "holdout", "adversarial"))
    assert all(t.params["layout"] == "blocks" for t in [*train[:20], *holdout, *adversarial])
    assert {layout_split(maze_for_task(t)) for t in holdout} == {"holdout"}
    assert {maze_bucket(maze_for_task(t)) for t in holdout if t.params["size"] == 9} == {14}
    assert overlapping_tasks(holdout, train) == [] and overlapping_tasks(adversarial, train) == []
    cells = cfg.model_copy(update={"layout": "cells"})
    assert split_version(cfg, "holdout") != split_version(cells, "holdout")
    assert maze_for_task(holdout[0]).content_hash() != maze_for_task(build_split(cells, "holdout")[0]).content_hash()
    env = make_env(cfg)
    assert {t.params["size"] for t in adversarial} == {7, 9, 11}
    for task in adversarial:
        maze = maze_for_task(task)
        _assert_block_perfect(maze)
        obs = env.reset(task)
        assert obs.images[0].size == (maze.size * 25,) * 2
        if task.params["variant"].startswith("theme:"):
            assert obs.images[0].tobytes() != render(maze, maze.start).tobytes()
        if task.params["variant"].startswith("transform:"):
            assert maze.transform == task.params["transform"]
        if task.params["variant"] == "placement:off_corner":
            assert maze.start not in maze.corners() and maze.goal not in maze.corners()


def test_block_ascii_view():
    maze = generate_maze(5, 1, layout="blocks")
    lines = ascii_maze(maze, maze.start).splitlines()
    assert len(lines) == 5 and all(len(line) == 10 for line in lines)
    assert lines[0] == "#" * 10 and "A" in "".join(lines) and "G" in "".join(lines)
    assert "*" in ascii_maze(maze, maze.goal)


def test_cli_render_and_play_blocks(tmp_path):
    runner = CliRunner()
    out = tmp_path / "maze.png"
    result = runner.invoke(
        app, ["render", "env.layout=blocks", "env.sizes=[9]", "--seed", "3", "-o", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    image = Image.open(out)
    assert image.size == (225, 225)
    maze = Maze.from_json(json.loads((tmp_path / "maze.json").read_text())["maze"])
    assert maze.layout == "blocks" and maze == maze_for_task(adhoc_task(9, 3, layout="blocks"))
    assert np.asarray(image.convert("RGB")).tobytes() == render(maze, maze.start).tobytes()
    bad = runner.invoke(app, ["render", "env.layout=blocks", "env.sizes=[8]", "-o", str(tmp_path / "x.png")])
    assert bad.exit_code != 0 and "odd maze sizes" in str(bad.exception)
    play = runner.invoke(app, ["play", "env.layout=blocks", "env.sizes=[9]", "--seed", "0", "--oracle"])
    assert play.exit_code == 0 and "Stopped on the goal." in play.output and "##" in play.output
