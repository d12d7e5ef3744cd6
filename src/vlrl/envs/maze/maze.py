"""Perfect mazes in two layouts: cells and walls, geometric transforms, a JSON form (generation: generate.py).

Coordinates are (row, col) with row 0 at the top and col 0 at the left. A maze of size N is a grid
of N*N squares; each square records which of its four sides are open (no wall): N (up, row-1),
E (right, col+1), S (down, row+1), W (left, col-1). One move goes one square.

Two layouts share this one `Maze` class and this one representation:

- `cells` (default): N x N cells inside an outer wall, walls are thin lines on cell borders. The
  maze is *perfect* when its open passages form a spanning tree: every cell is reachable and
  there is exactly one path between any two cells (N*N - 1 open edges, no cycle).
- `blocks` (the reference layout, as the SkyRL VisGym maze): N x N square blocks, N odd >= 5,
  and walls are whole blocks. The k x k rooms (k = (N-1)/2) sit at odd (row, col); the outer ring
  and every block at even (row, col) are walls; the block between two neighbouring rooms is a
  free passage or a wall. A block maze is a k x k cell maze expanded: room (i, j) is block
  (2i+1, 2j+1) and an open side between two rooms frees the block between them. It is stored as a
  grid over the N*N blocks where a wall block is closed on all four sides and a free block is
  open exactly towards its free neighbours, so moves, the BFS oracle and the transforms need no
  layout-specific code. It is perfect when its free blocks form a tree (connected, free - 1 open
  edges); expanding a perfect cell maze always gives one. (A closed block is a wall: with k >= 2
  every free block has a free neighbour.)

JSON form (`Maze.to_json`, read back identically by `Maze.from_json`)::

    {
      "format": "vlrl.maze/1",      # this format
      "layout": "cells",            # cells | blocks (absent = cells, JSON from before layouts)
      "generator": "wilson-1",      # generator version that made it (provenance)
      "seed": 3,                    # seed it was generated from (provenance)
      "transform": "none",          # none | mirror | rotate90 | rotate180 | rotate270 (provenance)
      "size": 5,                    # N
      "start": [0, 0],              # agent's start square [row, col]
      "goal": [4, 4],               # goal square [row, col]
      "open": [["ES", "EW", ...],   # cells only: open[row][col], the open sides of that cell,
               ...]                 # letters in the order N E S W ("" = closed on all sides)
      "blocks": ["#########",       # blocks only (instead of "open"): one string per row,
                 "#...#...#", ...]  # '#' a wall block, '.' a free block
    }

`from_json` rejects malformed input and imperfect mazes (a passage through the outer wall, a side
open on one cell but closed on its neighbour, squares not connected, a cycle, start or goal
outside the maze or on a wall block, blocks off the block layout) with a `VlrlError` saying which.

Generation is deterministic across Python versions: the random stream is Python's Mersenne
Twister seeded by a SHA-256 of (generator version, [layout,] size, seed, attempt), and only
`getrandbits` is used (with our own rejection sampling), never `random.choice`/`randrange`, whose
internals may change between Python versions.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from functools import cache
from typing import Any

from vlrl.errors import VlrlError

FORMAT = "vlrl.maze/1"
GENERATOR_VERSION = "wilson-1"
MIN_SIZE, MAX_SIZE = 3, 64
MIN_BLOCKS_SIZE = 5  # 2 x 2 rooms
LAYOUTS = ("cells", "blocks")

Cell = tuple[int, int]

# Side bits of a cell's `open` mask.
N, E, S, W = 1, 2, 4, 8
SIDES = (N, E, S, W)
SIDE_LETTER = {N: "N", E: "E", S: "S", W: "W"}
LETTER_SIDE = {v: k for k, v in SIDE_LETTER.items()}
DELTA = {N: (-1, 0), E: (0, 1), S: (1, 0), W: (0, -1)}
OPPOSITE = {N: S, S: N, E: W, W: E}
WALL_BLOCK, FREE_BLOCK = "#", "."

# Movement actions and the side each one crosses (the image's up is row - 1).
MOVES = ("up", "down", "left", "right")
# Maze.square_labels, per square: the square is a wall / the agent / the goal, then each move is open.
SQUARE_LABELS = ("wall", "agent", "goal", *(f"open_{m}" for m in MOVES))
ACTION_SIDE = {"up": N, "down": S, "left": W, "right": E}
SIDE_ACTION = {v: k for k, v in ACTION_SIDE.items()}

TRANSFORMS = ("none", "mirror", "rotate90", "rotate180", "rotate270")
PLACEMENTS = ("corners", "random", "off_corner")


def check_size(size: Any, layout: str = "cells") -> None:
    """Raise VlrlError unless `size` is a valid maze size for `layout` (blocks: odd and >= 5)."""
    if layout not in LAYOUTS:
        raise VlrlError(f"unknown maze layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if not _is_int(size) or not MIN_SIZE <= size <= MAX_SIZE:
        raise VlrlError(f"maze size must be an integer from {MIN_SIZE} to {MAX_SIZE}, got {size!r}")
    if layout == "blocks" and (size < MIN_BLOCKS_SIZE or size % 2 == 0):
        raise VlrlError(
            f"block maze size must be odd and >= {MIN_BLOCKS_SIZE} (N x N blocks around (N-1)/2 x (N-1)/2 rooms), "
            f"got {size}"
        )


@dataclass(frozen=True)
class Maze:
    """An N x N perfect maze with a start and a goal. `open` is row-major: open[r * N + c]."""

    size: int
    open: tuple[int, ...]
    start: Cell
    goal: Cell
    seed: int = 0
    generator: str = GENERATOR_VERSION
    transform: str = "none"
    layout: str = "cells"

    # -- geometry ----------------------------------------------------------------------------
    def is_open(self, cell: Cell, side: int) -> bool:
        """True when there is no wall on `side` of `cell`."""
        return bool(self.open[cell[0] * self.size + cell[1]] & side)

    def is_free(self, cell: Cell) -> bool:
        """True for a square the agent can stand on: any cell, or a block that is not a wall."""
        return self.layout == "cells" or self.open[cell[0] * self.size + cell[1]] != 0

    def free_squares(self) -> list[Cell]:
        """Every square the agent can stand on, row by row."""
        return [divmod(i, self.size) for i in range(self.size * self.size) if self.is_free(divmod(i, self.size))]

    def move(self, cell: Cell, action: str) -> Cell | None:
        """The cell reached by moving `action` from `cell`, or None when a wall is in the way."""
        side = ACTION_SIDE[action]
        if not self.is_open(cell, side):
            return None
        dr, dc = DELTA[side]
        return (cell[0] + dr, cell[1] + dc)

    def neighbours(self, cell: Cell) -> list[Cell]:
        """Cells reachable from `cell` in one move."""
        mask = self.open[cell[0] * self.size + cell[1]]
        return [(cell[0] + DELTA[s][0], cell[1] + DELTA[s][1]) for s in SIDES if mask & s]

    def corners(self) -> list[Cell]:
        """The four corner squares the agent can stand on: corner cells, or a block maze's corner rooms."""
        lo, hi = _corner_span(self.size, self.layout)
        return [(lo, lo), (lo, hi), (hi, lo), (hi, hi)]

    def open_edge_count(self) -> int:
        """Number of open passages between squares (free squares - 1 for a perfect maze)."""
        return sum(bin(m & (E | S)).count("1") for m in self.open)

    def square_labels(self, agent: Cell) -> list[list[float]]:
        """What each square shows, row by row, as SQUARE_LABELS: 1.0 or 0.0 per label.

        The dense targets of perception pretraining (vlrl.training.vision_pretrain): purely local
        facts about one square, no path or distance. A wall's four move labels are 0.
        """
        rows = []
        for i in range(self.size * self.size):
            cell = divmod(i, self.size)
            free = self.is_free(cell)
            rows.append(
                [float(not free), float(cell == tuple(agent)), float(cell == tuple(self.goal))]
                + [float(free and self.move(cell, m) is not None) for m in MOVES]
            )
        return rows

    # -- identity ----------------------------------------------------------------------------
    def content_hash(self) -> str:
        """SHA-256 hex of what the agent faces: layout, size, walls, start, goal (not seed or provenance)."""
        layout = "" if self.layout == "cells" else f"{self.layout}|"  # cell hashes predate layouts; keep them
        text = f"{layout}{self.size}|{bytes(self.open).hex()}|{self.start}|{self.goal}"
        return hashlib.sha256(text.encode()).hexdigest()

    def layout_hash(self) -> str:
        """SHA-256 hex of the walls alone (layout, size, walls): what the maze is without its start and goal."""
        return _walls_hash(self.layout, self.size, self.open)

    def canonical_layout_hash(self) -> str:
        """The smallest `layout_hash` over the maze's 8 mirror/rotation images.

        Equal for a wall layout and every mirrored or rotated copy of it, so a split that owns a
        layout by this hash also owns its disguises (see `vlrl.envs.maze.splits`).
        """
        return canonical_walls_hash(self.layout, self.size, self.open)

    # -- JSON --------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The documented JSON form (see the module docstring)."""
        n = self.size
        data: dict[str, Any] = {
            "format": FORMAT,
            "layout": self.layout,
            "generator": self.generator,
            "seed": self.seed,
            "transform": self.transform,
            "size": n,
            "start": list(self.start),
            "goal": list(self.goal),
        }
        if self.layout == "blocks":
            data["blocks"] = [
                "".join(FREE_BLOCK if self.is_free((r, c)) else WALL_BLOCK for c in range(n)) for r in range(n)
            ]
        else:
            data["open"] = [
                ["".join(SIDE_LETTER[s] for s in SIDES if self.open[r * n + c] & s) for c in range(n)] for r in range(n)
            ]
        return data

    @classmethod
    def from_json(cls, data: Any) -> Maze:
        """Read and validate the JSON form; raises VlrlError naming the first problem."""
        if not isinstance(data, dict):
            raise VlrlError(f"maze JSON must be an object, got {type(data).__name__}")
        layout = data.get("layout", "cells")  # JSON written before layouts existed is a cell maze
        if layout not in LAYOUTS:
            raise VlrlError(f"maze JSON: unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
        grid_key = "blocks" if layout == "blocks" else "open"
        keys = {"format", "generator", "seed", "transform", "size", "start", "goal", grid_key}
        missing, extra = keys - set(data), set(data) - keys - {"layout"}
        if missing:
            raise VlrlError(f"maze JSON is missing key(s) {sorted(missing)}")
        if extra:
            raise VlrlError(f"maze JSON has unknown key(s) {sorted(extra)} for layout {layout!r}")
        if data["format"] != FORMAT:
            raise VlrlError(f"maze JSON format is {data['format']!r}; this version reads {FORMAT!r}")
        if not isinstance(data["generator"], str) or not isinstance(data["transform"], str):
            raise VlrlError("maze JSON: 'generator' and 'transform' must be strings")
        if data["transform"] not in TRANSFORMS:
            raise VlrlError(f"maze JSON: unknown transform {data['transform']!r}; known: {', '.join(TRANSFORMS)}")
        seed, size = data["seed"], data["size"]
        if not _is_int(seed):
            raise VlrlError(f"maze JSON: 'seed' must be an integer, got {seed!r}")
        try:
            check_size(size, layout)
        except VlrlError as exc:
            raise VlrlError(f"maze JSON: {exc}") from None
        start, goal = _read_cell(data["start"], "start", size), _read_cell(data["goal"], "goal", size)
        if start == goal:
            raise VlrlError(f"maze JSON: start and goal are the same cell {list(start)}")
        masks = _read_blocks(data["blocks"], size) if layout == "blocks" else _read_open(data["open"], size)
        maze = cls(size, masks, start, goal, seed, data["generator"], data["transform"], layout)
        check_perfect(maze)
        return maze

    # -- transforms --------------------------------------------------------------------------
    def transformed(self, transform: str) -> Maze:
        """The same maze mirrored left-right or rotated clockwise; start/goal move with it.

        The result is again a perfect maze of the same layout (an odd block grid keeps its rooms
        at odd coordinates); actions keep their meaning in the (new) image.
        """
        if transform not in TRANSFORMS:
            raise VlrlError(f"unknown maze transform {transform!r}; known: {', '.join(TRANSFORMS)}")
        if transform == "none":
            return self
        if transform == "mirror":
            return self._remap(lambda r, c: (r, self.size - 1 - c), {N: N, S: S, E: W, W: E}, transform)
        maze = self
        for _ in range({"rotate90": 1, "rotate180": 2, "rotate270": 3}[transform]):
            maze = maze._remap(lambda r, c: (c, self.size - 1 - r), {N: E, E: S, S: W, W: N}, transform)
        return maze

    def _remap(self, where, side_map: dict[int, int], transform: str) -> Maze:
        n = self.size
        masks = [0] * (n * n)
        for r in range(n):
            for c in range(n):
                nr, nc = where(r, c)
                old = self.open[r * n + c]
                masks[nr * n + nc] = sum(side_map[s] for s in SIDES if old & s)
        return Maze(
            n, tuple(masks), where(*self.start), where(*self.goal), self.seed, self.generator, transform, self.layout
        )


def _walls_hash(layout: str, size: int, masks: tuple[int, ...]) -> str:
    return hashlib.sha256(f"{layout}|{size}|{bytes(masks).hex()}".encode()).hexdigest()


def _side_table(side_map: dict[int, int]) -> tuple[int, ...]:
    """For each of the 16 open-side masks, the mask with every side renamed by `side_map`."""
    return tuple(sum(side_map[s] for s in SIDES if m & s) for m in range(16))


_TURN_SIDES = _side_table({N: E, E: S, S: W, W: N})  # a quarter turn clockwise
_MIRROR_SIDES = _side_table({N: N, S: S, E: W, W: E})  # left-right mirror


@cache
def _symmetry_orders(n: int) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """The 8 mirror/rotation images as (source index per target square, side table per 16 masks)."""
    turn = [0] * (n * n)  # turn[i]: the square that lands on i after a quarter turn (r, c) -> (c, n-1-r)
    mirror = [0] * (n * n)
    for i in range(n * n):
        r, c = divmod(i, n)
        turn[c * n + n - 1 - r] = i
        mirror[r * n + n - 1 - c] = i
    images = []
    for order, sides in ((tuple(range(n * n)), tuple(range(16))), (tuple(mirror), _MIRROR_SIDES)):
        for _ in range(4):
            images.append((order, sides))
            order = tuple(order[j] for j in turn)
            sides = tuple(_TURN_SIDES[sides[m]] for m in range(16))
    return tuple(images)


def canonical_walls_hash(layout: str, size: int, masks: tuple[int, ...]) -> str:
    """The smallest walls hash over the 8 images (4 rotations, each mirrored or not) of `masks`."""
    return min(
        _walls_hash(layout, size, tuple(sides[masks[j]] for j in order)) for order, sides in _symmetry_orders(size)
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _corner_span(size: int, layout: str) -> tuple[int, int]:
    """Row/col of the first and last square a corner can be: the outer cells, or the outer rooms."""
    return (1, size - 2) if layout == "blocks" else (0, size - 1)


def _read_cell(value: Any, name: str, size: int) -> Cell:
    if not (isinstance(value, list) and len(value) == 2 and all(_is_int(v) for v in value)):
        raise VlrlError(f"maze JSON: '{name}' must be [row, col], got {value!r}")
    r, c = value
    if not (0 <= r < size and 0 <= c < size):
        raise VlrlError(f"maze JSON: {name} {value} is outside the {size}x{size} maze")
    return (r, c)


def _read_open(rows: Any, size: int) -> tuple[int, ...]:
    """The masks of a cell maze's `open` rows."""
    if not isinstance(rows, list) or len(rows) != size or any(not isinstance(r, list) or len(r) != size for r in rows):
        raise VlrlError(f"maze JSON: 'open' must be {size} rows of {size} strings")
    masks: list[int] = []
    for r, row in enumerate(rows):
        for c, letters in enumerate(row):
            if (
                not isinstance(letters, str)
                or any(ch not in LETTER_SIDE for ch in letters)
                or len(set(letters)) != len(letters)
            ):
                raise VlrlError(f"maze JSON: open[{r}][{c}] = {letters!r} must be distinct letters from 'NESW'")
            masks.append(sum(LETTER_SIDE[ch] for ch in letters))
    return tuple(masks)


def _read_blocks(rows: Any, size: int) -> tuple[int, ...]:
    """The masks of a block maze's `blocks` rows, after checking the blocks sit on the block layout."""
    if not isinstance(rows, list) or len(rows) != size or any(not isinstance(r, str) or len(r) != size for r in rows):
        raise VlrlError(f"maze JSON: 'blocks' must be {size} strings of {size} characters")
    for r, row in enumerate(rows):
        bad = sorted(set(row) - {WALL_BLOCK, FREE_BLOCK})
        if bad:
            raise VlrlError(
                f"maze JSON: blocks[{r}] contains {bad[0]!r}; use '{WALL_BLOCK}' for a wall block, '{FREE_BLOCK}' "
                "for a free one"
            )
    free = [ch == FREE_BLOCK for row in rows for ch in row]
    # Checked on the grid itself: a lone free block would read back as a wall from its masks.
    _check_block_grid(size, free)
    return block_masks(size, free)


def block_masks(size: int, free: list[bool]) -> tuple[int, ...]:
    """Open-side masks of a block grid: a free block is open exactly towards its free neighbours."""
    n = size
    masks = [0] * (n * n)
    for i in range(n * n):
        if free[i]:
            r, c = divmod(i, n)
            for s in SIDES:
                nr, nc = r + DELTA[s][0], c + DELTA[s][1]
                if 0 <= nr < n and 0 <= nc < n and free[nr * n + nc]:
                    masks[i] |= s
    return tuple(masks)


def _check_block_grid(size: int, free: list[bool]) -> None:
    """Raise unless free blocks sit where the block layout allows: rooms free, ring and pillars walls."""
    n = size
    for r in range(n):
        for c in range(n):
            is_free = free[r * n + c]
            if is_free and (r in (0, n - 1) or c in (0, n - 1)):
                raise VlrlError(f"block maze is not closed: block [{r}, {c}] on the outer wall is free")
            if is_free and r % 2 == 0 and c % 2 == 0:
                raise VlrlError(f"block maze: block [{r}, {c}] is free, but blocks at even (row, col) are always walls")
            if not is_free and r % 2 == 1 and c % 2 == 1:
                raise VlrlError(
                    f"block maze: room [{r}, {c}] is a wall, but blocks at odd (row, col) are rooms, always free"
                )


def check_perfect(maze: Maze) -> None:
    """Raise VlrlError unless the maze is closed, symmetric, connected and acyclic (blocks: and on the layout)."""
    n = maze.size
    check_size(n, maze.layout)
    if len(maze.open) != n * n:
        raise VlrlError(f"maze has {len(maze.open)} cells, expected {n * n}")
    for r in range(n):
        for c in range(n):
            for side in SIDES:
                if not maze.is_open((r, c), side):
                    continue
                nr, nc = r + DELTA[side][0], c + DELTA[side][1]
                if not (0 <= nr < n and 0 <= nc < n):
                    raise VlrlError(
                        f"maze is not closed: cell [{r}, {c}] opens {SIDE_LETTER[side]} through the outer wall"
                    )
                if not maze.is_open((nr, nc), OPPOSITE[side]):
                    raise VlrlError(
                        f"maze walls are asymmetric: [{r}, {c}] opens {SIDE_LETTER[side]} "
                        f"but [{nr}, {nc}] is closed {SIDE_LETTER[OPPOSITE[side]]}"
                    )
    if maze.layout == "blocks":
        for r in range(1, n, 2):
            for c in range(1, n, 2):
                if maze.open[r * n + c] == 0:  # from masks alone, a walled-in room looks like a wall block
                    raise VlrlError(f"maze is not connected: room [{r}, {c}] is closed on all sides")
        free = [m != 0 for m in maze.open]
        _check_block_grid(n, free)
        if maze.open != block_masks(n, free):
            raise VlrlError(
                "block maze has a wall line between two free blocks; in a block maze only whole blocks are walls"
            )
    for name, cell in (("start", maze.start), ("goal", maze.goal)):
        if not maze.is_free(cell):
            raise VlrlError(f"maze {name} {list(cell)} is on a wall block")
    squares = len(maze.free_squares())
    what = "free blocks" if maze.layout == "blocks" else "cells"
    seen = {maze.start}
    queue = deque([maze.start])
    while queue:
        for nxt in maze.neighbours(queue.popleft()):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    if len(seen) != squares:
        raise VlrlError(f"maze is not connected: only {len(seen)} of {squares} {what} are reachable from the start")
    edges = maze.open_edge_count()
    if edges != squares - 1:
        raise VlrlError(
            f"maze has a cycle: {edges} open passages where a perfect maze of {squares} {what} has {squares - 1}"
        )
