"""An imperfect demonstrator beside the BFS oracle: a depth-first walker.

The walker sees what the agent sees: the maze's layout and the goal (the image), its own position
and the cells it has visited (the conversation so far). It never plans a way to the goal. At the start
it fixes an order of preferred directions: the moves towards the goal first (the larger offset
first), then the moves away from it. At each turn it takes the first open move in that order into a
cell it has not visited; at a dead end it goes back along the way it came; on the goal it
says `stop` (or the episode has ended, when `env.stop_required` is false). A depth-first search with
a preferred branch: it always finds the goal of a perfect maze, but often after the turn limit, as
an explorer does, not a planner (measured: bench/results/2026-12-03-cpu-demo-demonstrator/README.md).

Three kinds (`train.sft.demonstrator`):
- `walker`: deterministic, the same maze gives the same walk (ties broken up, right, down, left);
- `walker_random`: stochastic, the moves towards the goal and those away from it each in an order
  drawn once per episode from an rng (the SFT seeds it per task and train.seed), then kept;
- `walker_blind`: deterministic and goal-blind, the fixed order up, right, down, left in every maze
  (it still stops on the goal). A weaker demonstrator, for tasks where the goal-facing walker leaves
  little between itself and the oracle (the CPU demo's 3x3 mazes: walker 71.5%, oracle ~95%).
"""

from __future__ import annotations

import random
from collections import deque

from vlrl.envs.maze.maze import Cell, Maze

FIXED_ORDER = ("up", "right", "down", "left")
DEMONSTRATORS = ("walker", "walker_random", "walker_blind")  # the names DfsWalker.named knows


class DfsWalker:
    """Depth-first walk of one episode; `action(pos)` is the move at `pos` (the agent's real position).

    Its only state is the set of cells the agent stood on. At a dead end it takes the shortest way to
    the nearest unvisited cell: in a perfect maze walked without noise that is backtracking along the
    way it came (every unexplored branch hangs off that way, the deepest one nearest), and after turns
    the walker did not choose (`train.sft.noise`) it goes on from wherever the agent really is."""

    def __init__(self, maze: Maze, order: tuple[str, ...] = FIXED_ORDER):
        if sorted(order) != sorted(FIXED_ORDER):
            raise ValueError(f"a walker's order must be the four moves once each, got {order}")
        self.maze, self.order = maze, tuple(order)
        self.visited: set[Cell] = {maze.start}

    @classmethod
    def named(cls, name: str, maze: Maze, rng: random.Random) -> DfsWalker:
        """The walker of demonstrator `name` (one of DEMONSTRATORS) on `maze`."""
        if name not in DEMONSTRATORS:
            raise ValueError(f"no walker named {name!r}; the walkers are {', '.join(DEMONSTRATORS)}")
        if name == "walker_blind":
            return cls(maze, FIXED_ORDER)
        return cls.for_maze(maze, rng if name == "walker_random" else None)

    @classmethod
    def for_maze(cls, maze: Maze, rng: random.Random | None = None) -> DfsWalker:
        """The walker of `maze`: goal-facing order (`preferred_order`), shuffled within its halves by `rng`."""
        return cls(maze, preferred_order(maze, rng))

    def action(self, pos: Cell) -> str:
        """The walker's move at `pos`: `stop` on the goal, else forward to an unvisited cell, else back."""
        # Only cells the agent stood on count as visited: a move the walker chose may not have been played.
        self.visited.add(pos)
        if pos == self.maze.goal:
            return "stop"
        for move in self.order:
            nxt = self.maze.move(pos, move)
            if nxt is not None and nxt not in self.visited:
                return move
        return self._towards_unvisited(pos)

    def _towards_unvisited(self, pos: Cell) -> str:
        """The first move of the shortest way to the nearest unvisited cell (`stop` if none is left)."""
        # One BFS from `pos` that carries each cell's first move, so the way is not searched again.
        first: dict[Cell, str] = {pos: "stop"}
        queue: deque[Cell] = deque()
        for move in self.order:
            nxt = self.maze.move(pos, move)
            if nxt is not None and nxt not in first:
                first[nxt] = move
                queue.append(nxt)
        while queue:
            cell = queue.popleft()
            if cell not in self.visited:
                return first[cell]
            for nxt in self.maze.neighbours(cell):
                if nxt not in first:
                    first[nxt] = first[cell]
                    queue.append(nxt)
        return "stop"  # everything reachable was visited (cannot happen in a connected maze)


def preferred_order(maze: Maze, rng: random.Random | None = None, at: Cell | None = None) -> tuple[str, ...]:
    """The four moves, those towards the goal (seen from `at`, default the start) before those away from it.

    Without `rng`: within each half by the size of the offset (larger first), ties in FIXED_ORDER.
    With `rng`: each half in a random order (the walker_random demonstrator)."""
    at = maze.start if at is None else at
    dr, dc = maze.goal[0] - at[0], maze.goal[1] - at[1]
    gain = {"up": -dr, "down": dr, "left": -dc, "right": dc}
    towards = [m for m in FIXED_ORDER if gain[m] > 0]
    away = [m for m in FIXED_ORDER if gain[m] <= 0]
    if rng is None:
        towards.sort(key=lambda m: -gain[m])
        away.sort(key=lambda m: -gain[m])
    else:
        rng.shuffle(towards)
        rng.shuffle(away)
    return (*towards, *away)


def walk(
    maze: Maze,
    max_turns: int,
    rng: random.Random | None = None,
    stop_required: bool = False,
    walker: DfsWalker | None = None,
) -> bool:
    """Whether the walker reaches the goal within `max_turns` turns (`stop` counted when required).

    `walker` plays instead of `DfsWalker.for_maze(maze, rng)`, e.g. a variant under study in a benchmark."""
    walker, pos = walker or DfsWalker.for_maze(maze, rng), maze.start
    for _ in range(max_turns):
        move = walker.action(pos)
        if move == "stop":
            return True
        pos = maze.move(pos, move)
        if pos == maze.goal and not stop_required:
            return True
    return False
