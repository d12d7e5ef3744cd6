"""The greedy-every-cell walker (greedy_walker.py's docstring says what it is)."""

from vlrl.envs.maze import walker as W


def order_at(maze, pos):
    dr, dc = maze.goal[0] - pos[0], maze.goal[1] - pos[1]
    gain = {"up": -dr, "down": dr, "left": -dc, "right": dc}
    return tuple(sorted(W.FIXED_ORDER, key=lambda m: -gain[m]))  # stable: ties in FIXED_ORDER


def walk_greedy(maze, max_turns, stop_required):
    walker, pos = W.DfsWalker(maze), maze.start
    for _ in range(max_turns):
        walker.order = order_at(maze, pos)
        move = walker.action(pos)
        if move == "stop":
            return True
        pos = maze.move(pos, move)
        if pos == maze.goal and not stop_required:
            return True
    return False
