"""The BFS oracle: exact distances, shortest paths and the optimal next action.

In a perfect maze the shortest path between two cells is the only simple path, so following
`next_action` from any cell reaches the goal in exactly `distances_to(maze, goal)` moves. Block
mazes need nothing special: their wall blocks are closed squares, so the BFS runs over the free
blocks only (a wall block's distance is -1).
"""

from __future__ import annotations

from collections import deque

from vlrl.envs.maze.maze import DELTA, SIDE_ACTION, SIDES, Cell, Maze


def distances_to(maze: Maze, target: Cell) -> list[list[int]]:
    """BFS distance (in moves) from every cell to `target`: dist[row][col]; -1 if unreachable."""
    n = maze.size
    dist = [[-1] * n for _ in range(n)]
    dist[target[0]][target[1]] = 0
    queue = deque([target])
    while queue:
        cell = queue.popleft()
        for nr, nc in maze.neighbours(cell):
            if dist[nr][nc] < 0:
                dist[nr][nc] = dist[cell[0]][cell[1]] + 1
                queue.append((nr, nc))
    return dist


def _step_towards(maze: Maze, cell: Cell, dist: list[list[int]]) -> tuple[str, Cell]:
    """The move (and cell) that lowers the distance by one; sides tried in N E S W order."""
    here = dist[cell[0]][cell[1]]
    for side in SIDES:
        if maze.is_open(cell, side):
            nr, nc = cell[0] + DELTA[side][0], cell[1] + DELTA[side][1]
            if dist[nr][nc] == here - 1:
                return SIDE_ACTION[side], (nr, nc)
    raise ValueError(f"no move from {cell} lowers the distance; the maze is not connected")


def shortest_path(maze: Maze, a: Cell, b: Cell) -> list[Cell]:
    """Cells of the shortest path from a to b, both included."""
    dist = distances_to(maze, b)
    path = [a]
    while path[-1] != b:
        path.append(_step_towards(maze, path[-1], dist)[1])
    return path


def optimal_actions(maze: Maze, pos: Cell, goal: Cell) -> list[str]:
    """Moves (up/down/left/right) of the shortest path from pos to goal; [] when already there."""
    dist = distances_to(maze, goal)
    actions = []
    while pos != goal:
        action, pos = _step_towards(maze, pos, dist)
        actions.append(action)
    return actions


def next_action(maze: Maze, pos: Cell) -> str:
    """The oracle's action at `pos`: the first move towards the maze's goal, or `stop` on it."""
    if pos == maze.goal:
        return "stop"
    return _step_towards(maze, pos, distances_to(maze, maze.goal))[0]
