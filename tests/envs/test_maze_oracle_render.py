"""BFS oracle optimality and deterministic rendering."""

from __future__ import annotations

import io
from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vlrl.envs.maze.generate import generate_maze
from vlrl.envs.maze.oracle import distances_to, next_action, optimal_actions, shortest_path
from vlrl.envs.maze.render import THEMES, ascii_maze, render, wall_thickness

sizes = st.integers(min_value=3, max_value=13)
seeds = st.integers(min_value=0, max_value=2**40)

STEP = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
SIDE_BIT = {(-1, 0): 1, (0, 1): 2, (1, 0): 4, (0, -1): 8}


def independent_bfs(maze, a, b) -> int:
    """Shortest path length from a to b using only the raw open masks."""
    n, dist, queue = maze.size, {a: 0}, deque([a])
    while queue:
        r, c = queue.popleft()
        for (dr, dc), bit in SIDE_BIT.items():
            if maze.open[r * n + c] & bit and (r + dr, c + dc) not in dist:
                dist[(r + dr, c + dc)] = dist[(r, c)] + 1
                queue.append((r + dr, c + dc))
    return dist[b]


@settings(max_examples=60, deadline=None)
@given(size=sizes, seed=seeds, placement=st.sampled_from(["corners", "random"]))
def test_oracle_paths_are_optimal(size, seed, placement):
    maze = generate_maze(size, seed, placement=placement, min_distance=1)
    d = independent_bfs(maze, maze.start, maze.goal)
    assert distances_to(maze, maze.goal)[maze.start[0]][maze.start[1]] == d
    path = shortest_path(maze, maze.start, maze.goal)
    assert path[0] == maze.start and path[-1] == maze.goal and len(path) == d + 1
    actions = optimal_actions(maze, maze.start, maze.goal)
    assert len(actions) == d
    pos = maze.start
    for action in actions:  # every oracle move is legal and follows the path
        nxt = maze.move(pos, action)
        assert nxt is not None
        pos = nxt
    assert pos == maze.goal
    assert next_action(maze, maze.goal) == "stop"
    assert next_action(maze, maze.start) == actions[0]


@settings(max_examples=25, deadline=None)
@given(size=sizes, seed=seeds, cell_px=st.integers(min_value=4, max_value=30), theme=st.sampled_from(sorted(THEMES)))
def test_render_is_deterministic_and_sized(size, seed, cell_px, theme):
    maze = generate_maze(size, seed)
    a = render(maze, maze.start, cell_px, theme, noise_seed=seed)
    b = render(maze, maze.start, cell_px, theme, noise_seed=seed)
    assert a.mode == "RGB" and a.size == (size * cell_px, size * cell_px)
    assert a.tobytes() == b.tobytes()
    buf_a, buf_b = io.BytesIO(), io.BytesIO()
    a.save(buf_a, format="PNG")
    b.save(buf_b, format="PNG")
    assert buf_a.getvalue() == buf_b.getvalue()


def test_reference_look_at_9x9():
    maze = generate_maze(9, 3)
    image = render(maze, maze.start)
    assert image.size == (225, 225)
    px = np.asarray(image)
    gr, gc = maze.goal
    ar, ac = maze.start
    assert tuple(px[gr * 25 + 12, gc * 25 + 12]) == (255, 0, 0)  # goal: red square
    assert tuple(px[ar * 25 + 12, ac * 25 + 12]) == (0, 0, 255)  # agent: blue circle centre
    assert tuple(px[ar * 25 + 4, ac * 25 + 4]) == (255, 255, 255)  # circle, not a square: corner is floor
    assert tuple(px[0, 100]) == (169, 169, 169)  # outer wall: gray
    colours = {tuple(c) for c in px.reshape(-1, 3)}
    assert colours == {(255, 255, 255), (169, 169, 169), (255, 0, 0), (0, 0, 255)}  # no anti-aliasing
    assert wall_thickness(25) == 3 and wall_thickness(16) == 2 and wall_thickness(8) == 2 and wall_thickness(4) == 1


def test_walls_are_drawn_where_closed():
    maze = generate_maze(5, 2)
    px = np.asarray(render(maze, maze.start, cell_px=16))
    for r in range(5):
        for c in range(4):
            colour = tuple(px[r * 16 + 8, (c + 1) * 16])  # midpoint of the border east of (r, c)
            if maze.is_open((r, c), 2):
                assert colour != (169, 169, 169)
            else:
                assert colour == (169, 169, 169)


def test_agent_moves_change_the_image_and_themes_differ():
    maze = generate_maze(5, 0)
    base = render(maze, maze.start, 16)
    moved_to = maze.neighbours(maze.start)[0]
    assert render(maze, moved_to, 16).tobytes() != base.tobytes()
    for theme in ("dark", "pastel", "noise"):
        assert render(maze, maze.start, 16, theme, noise_seed=1).tobytes() != base.tobytes()
    assert render(maze, maze.start, 16, "noise", 1).tobytes() != render(maze, maze.start, 16, "noise", 2).tobytes()


def test_ascii_view():
    maze = generate_maze(3, 0)
    text = ascii_maze(maze, maze.start)
    lines = text.splitlines()
    assert len(lines) == 7 and all(len(line) == 13 for line in lines)
    assert text.count("A") == 1 and text.count("G") == 1
    assert "*" in ascii_maze(maze, maze.goal)
