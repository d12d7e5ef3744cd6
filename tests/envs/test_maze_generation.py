"""Maze generation, JSON form, validation and transforms."""

from __future__ import annotations

import copy
import json
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlrl.envs.maze.generate import generate_maze
from vlrl.envs.maze.maze import TRANSFORMS, Maze, check_perfect
from vlrl.errors import VlrlError

sizes = st.integers(min_value=3, max_value=13)
seeds = st.integers(min_value=0, max_value=2**40)


def _edges(maze: Maze) -> set[frozenset]:
    """Undirected open edges read straight from the masks (independent of Maze helpers)."""
    n, edges = maze.size, set()
    for r in range(n):
        for c in range(n):
            m = maze.open[r * n + c]
            if m & 2:
                edges.add(frozenset({(r, c), (r, c + 1)}))
            if m & 4:
                edges.add(frozenset({(r, c), (r + 1, c)}))
    return edges


def _assert_perfect(maze: Maze) -> None:
    n = maze.size
    edges = _edges(maze)
    assert len(edges) == n * n - 1
    adjacency: dict = {}
    for e in edges:
        a, b = tuple(e)
        adjacency.setdefault(a, []).append(b)
        adjacency.setdefault(b, []).append(a)
    seen, queue = {(0, 0)}, deque([(0, 0)])
    while queue:
        for nxt in adjacency.get(queue.popleft(), []):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    assert len(seen) == n * n
    # no opening through the outer wall
    for c in range(n):
        assert not maze.open[c] & 1 and not maze.open[(n - 1) * n + c] & 4
    for r in range(n):
        assert not maze.open[r * n] & 8 and not maze.open[r * n + n - 1] & 2


@settings(max_examples=80, deadline=None)
@given(size=sizes, seed=seeds, placement=st.sampled_from(["corners", "random", "off_corner"]))
def test_every_maze_is_perfect(size, seed, placement):
    maze = generate_maze(size, seed, placement=placement, min_distance=2)
    if maze is None:
        return
    _assert_perfect(maze)
    assert maze.start != maze.goal
    if placement == "corners":
        assert {maze.start, maze.goal} <= set(maze.corners())
        assert maze.start[0] != maze.goal[0] and maze.start[1] != maze.goal[1]  # opposite corners
    if placement == "off_corner":
        assert maze.start not in maze.corners() and maze.goal not in maze.corners()


@settings(max_examples=60, deadline=None)
@given(size=sizes, seed=seeds, transform=st.sampled_from(TRANSFORMS))
def test_json_round_trips_exactly(size, seed, transform):
    maze = generate_maze(size, seed, transform=transform)
    data = maze.to_json()
    again = Maze.from_json(json.loads(json.dumps(data)))
    assert again == maze
    assert again.to_json() == data


def test_generation_is_deterministic_and_seed_dependent():
    assert generate_maze(9, 3) == generate_maze(9, 3)
    assert generate_maze(9, 3).open != generate_maze(9, 4).open
    assert generate_maze(9, 3).open != generate_maze(9, 3, attempt=1).open


def test_generation_is_pinned():
    # Guards the generator's determinism across Python/library versions: a change here changes
    # every split, so bump GENERATOR_VERSION instead of editing this hash.
    assert generate_maze(5, 0).content_hash()[:16] == "5d4467210dcb1a6b"
    assert generate_maze(9, 3).content_hash()[:16] == "55f31b3355e3c7da"


@settings(max_examples=40, deadline=None)
@given(size=sizes, seed=seeds, transform=st.sampled_from(TRANSFORMS[1:]))
def test_transforms_keep_the_maze_perfect(size, seed, transform):
    base = generate_maze(size, seed)
    moved = base.transformed(transform)
    _assert_perfect(moved)
    assert moved.transform == transform
    # rotating four times or mirroring twice gives the original back
    if transform == "mirror":
        assert moved.transformed("mirror").open == base.open
    if transform == "rotate90":
        assert moved.transformed("rotate270").open == base.open
        assert moved.transformed("rotate90").open == base.transformed("rotate180").open


def test_rotate90_is_clockwise():
    maze = generate_maze(5, 1)
    rotated = maze.transformed("rotate90")
    n = maze.size
    assert rotated.start == (maze.start[1], n - 1 - maze.start[0])
    # a wall on the east side of (r, c) becomes a wall on the south side of (c, n-1-r)
    for r in range(n):
        for c in range(n):
            assert maze.is_open((r, c), 2) == rotated.is_open((c, n - 1 - r), 4)


def _mutated(maze: Maze, fn) -> dict:
    data = copy.deepcopy(maze.to_json())
    fn(data)
    return data


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("open"), "missing"),
        (lambda d: d.update(extra=1), "unknown key"),
        (lambda d: d.update(format="v0"), "format"),
        (lambda d: d.update(size=2), "size"),
        (lambda d: d.update(start=[9, 9]), "outside"),
        (lambda d: d.update(goal="a"), "goal"),
        (lambda d: d.update(goal=d["start"]), "same cell"),
        (lambda d: d["open"].pop(), "rows"),
        (lambda d: d["open"][0].__setitem__(0, "X"), "letters"),
        (lambda d: d["open"][0].__setitem__(0, d["open"][0][0] + "N"), "outer wall"),
        (lambda d: d.update(transform="flip"), "transform"),
    ],
)
def test_from_json_rejects_malformed(mutate, message):
    maze = generate_maze(5, 0)
    with pytest.raises(VlrlError, match=message):
        Maze.from_json(_mutated(maze, mutate))


def test_from_json_rejects_imperfect_mazes():
    maze = generate_maze(5, 0)
    data = maze.to_json()
    # find a closed interior east wall and open it on both sides -> a cycle
    for r in range(5):
        for c in range(4):
            if "E" not in data["open"][r][c]:
                cyc = copy.deepcopy(data)
                cyc["open"][r][c] = "".join(s for s in "NESW" if s in cyc["open"][r][c] + "E")
                cyc["open"][r][c + 1] = "".join(s for s in "NESW" if s in cyc["open"][r][c + 1] + "W")
                with pytest.raises(VlrlError, match="cycle"):
                    Maze.from_json(cyc)
                asym = copy.deepcopy(data)
                asym["open"][r][c] = cyc["open"][r][c]
                with pytest.raises(VlrlError, match="asymmetric"):
                    Maze.from_json(asym)
                break
        else:
            continue
        break
    # close every passage of the goal cell (on both sides) -> not connected
    cut = copy.deepcopy(data)
    gr, gc = maze.goal
    for nr, nc in maze.neighbours(maze.goal):
        back = {(-1, 0): "S", (1, 0): "N", (0, -1): "E", (0, 1): "W"}[(nr - gr, nc - gc)]
        cut["open"][nr][nc] = cut["open"][nr][nc].replace(back, "")
    cut["open"][gr][gc] = ""
    with pytest.raises(VlrlError, match="not connected"):
        Maze.from_json(cut)
    with pytest.raises(VlrlError):
        Maze.from_json([1, 2])


def test_check_perfect_accepts_generated():
    for n in (3, 13, 30):
        check_perfect(generate_maze(n, 5))


def test_bad_generation_arguments():
    with pytest.raises(VlrlError, match="size"):
        generate_maze(2, 0)
    with pytest.raises(VlrlError, match="size"):
        generate_maze(65, 0)
    with pytest.raises(VlrlError, match="placement"):
        generate_maze(5, 0, placement="middle")
    with pytest.raises(VlrlError, match="min_distance"):
        generate_maze(3, 0, placement="random", min_distance=100)
    assert generate_maze(3, 0, placement="off_corner", min_distance=8) is None  # possible in general, not here
