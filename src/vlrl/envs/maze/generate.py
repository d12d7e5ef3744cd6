"""Maze generation: Wilson's algorithm (a uniform spanning tree), expanded to blocks for the block
layout, then start and goal placed and a transform applied. Mazes are a pure function of
(size, seed, attempt, layout): the RNG is keyed by `GENERATOR_VERSION`, and integers are drawn
from `getrandbits` alone, so the same maze comes out on every Python version.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque

from vlrl.envs.maze.maze import (
    DELTA,
    GENERATOR_VERSION,
    OPPOSITE,
    PLACEMENTS,
    SIDES,
    Cell,
    E,
    Maze,
    N,
    S,
    W,
    _corner_span,
    block_masks,
    check_size,
)
from vlrl.errors import VlrlError


def _rng(size: int, seed: int, attempt: int, layout: str = "cells") -> random.Random:
    # Cell mazes keep the key they had before layouts existed, so their mazes (and splits) stay.
    what = f"{size}" if layout == "cells" else f"{layout}:{size}"
    key = f"{GENERATOR_VERSION}:{what}:{seed}:{attempt}"
    digest = hashlib.sha256(key.encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _below(rng: random.Random, k: int) -> int:
    """Uniform integer in [0, k) from getrandbits alone (stable across Python versions)."""
    if k <= 1:
        return 0
    bits = (k - 1).bit_length()
    while True:
        r = rng.getrandbits(bits)
        if r < k:
            return r


def wilson_tree(size: int, rng: random.Random) -> tuple[int, ...]:
    """Open-side masks of a uniform spanning tree of the size x size grid (Wilson's algorithm).

    Loop-erased random walks from each cell not yet in the tree until they hit it; the walk's
    last exit direction from each cell is kept, which erases loops for free.
    """
    n = size
    cells = n * n
    steps: list[list[tuple[int, int]]] = []  # per cell: (neighbour index, side) pairs
    for i in range(cells):
        r, c = divmod(i, n)
        steps.append(
            [
                ((r + DELTA[s][0]) * n + c + DELTA[s][1], s)
                for s in SIDES
                if 0 <= r + DELTA[s][0] < n and 0 <= c + DELTA[s][1] < n
            ]
        )
    masks = [0] * cells
    in_tree = [False] * cells
    in_tree[_below(rng, cells)] = True
    exit_step: list[tuple[int, int]] = [(0, 0)] * cells
    for first in range(cells):
        cur = first
        while not in_tree[cur]:
            options = steps[cur]
            exit_step[cur] = options[_below(rng, len(options))]
            cur = exit_step[cur][0]
        cur = first
        while not in_tree[cur]:
            nxt, side = exit_step[cur]
            masks[cur] |= side
            masks[nxt] |= OPPOSITE[side]
            in_tree[cur] = True
            cur = nxt
    return tuple(masks)


def _distances_flat(size: int, masks: tuple[int, ...], source: int) -> list[int]:
    dist = [-1] * (size * size)
    dist[source] = 0
    queue = deque([source])
    offset = {N: -size, S: size, E: 1, W: -1}
    while queue:
        i = queue.popleft()
        m = masks[i]
        for s in SIDES:
            if m & s:
                j = i + offset[s]
                if dist[j] < 0:
                    dist[j] = dist[i] + 1
                    queue.append(j)
    return dist


def expand_to_blocks(rooms: int, room_masks: tuple[int, ...]) -> tuple[int, ...]:
    """Block masks of the (2k+1) x (2k+1) block maze whose k x k rooms connect as the cell maze `room_masks`."""
    n = 2 * rooms + 1
    free = [False] * (n * n)
    for i, m in enumerate(room_masks):
        r, c = divmod(i, rooms)
        block = (2 * r + 1) * n + 2 * c + 1
        free[block] = True
        if m & E:
            free[block + 1] = True  # the passage block to the room on the right
        if m & S:
            free[block + n] = True  # the passage block to the room below
    return block_masks(n, free)


def _place(
    size: int, masks: tuple[int, ...], rng: random.Random, placement: str, min_distance: int, layout: str = "cells"
) -> tuple[Cell, Cell] | None:
    """Start and goal squares; None when this maze has no placement satisfying the rule."""
    n = size
    lo, hi = _corner_span(n, layout)
    if placement == "corners":
        # Like the reference: one of the four opposite-corner pairs (corner rooms of a block maze).
        pairs = [((lo, lo), (hi, hi)), ((hi, hi), (lo, lo)), ((hi, lo), (lo, hi)), ((lo, hi), (hi, lo))]
        return pairs[_below(rng, 4)]
    corners = {lo * n + lo, lo * n + hi, hi * n + lo, hi * n + hi}
    free = [i for i in range(n * n) if layout == "cells" or masks[i]]
    allowed = [i for i in free if placement == "random" or i not in corners]
    for k in range(len(allowed) - 1, 0, -1):  # Fisher-Yates: try starts in a random order
        j = _below(rng, k + 1)
        allowed[k], allowed[j] = allowed[j], allowed[k]
    allowed_set = set(allowed)
    for start in allowed[:64]:
        dist = _distances_flat(n, masks, start)
        goals = [i for i in range(n * n) if i in allowed_set and dist[i] >= min_distance]
        if goals:
            goal = goals[_below(rng, len(goals))]
            return divmod(start, n), divmod(goal, n)
    return None


def generate_maze(
    size: int,
    seed: int,
    *,
    attempt: int = 0,
    placement: str = "corners",
    min_distance: int = 1,
    transform: str = "none",
    layout: str = "cells",
) -> Maze | None:
    """The maze of (layout, size, seed, attempt): Wilson's tree, then start/goal, then the transform.

    Layout `cells`: an N x N cell maze. Layout `blocks` (N odd >= 5): a k x k cell maze,
    k = (N-1)/2, expanded to N x N blocks (see the module docstring).
    Placement: `corners` (one of the four opposite-corner pairs, as the reference; corner rooms
    for blocks), `random` (any two free squares at BFS distance >= min_distance) or `off_corner`
    (random, no corner square). Returns None when the placement rule cannot be met in this maze
    (try another attempt).
    """
    check_size(size, layout)
    if placement not in PLACEMENTS:
        raise VlrlError(f"unknown placement {placement!r}; known: {', '.join(PLACEMENTS)}")
    rooms = (size - 1) // 2
    squares = size * size if layout == "cells" else 2 * rooms * rooms - 1
    if placement != "corners" and min_distance > squares - 1:
        raise VlrlError(
            f"min_distance {min_distance} is impossible in a {size}x{size} {layout} maze (at most {squares - 1}); "
            "lower env.min_distance"
        )
    rng = _rng(size, seed, attempt, layout)
    if layout == "blocks":
        masks = expand_to_blocks(rooms, wilson_tree(rooms, rng))
    else:
        masks = wilson_tree(size, rng)
    placed = _place(size, masks, rng, placement, min_distance, layout)
    if placed is None:
        return None
    maze = Maze(size, masks, placed[0], placed[1], seed, GENERATOR_VERSION, layout=layout)
    return maze.transformed(transform)
