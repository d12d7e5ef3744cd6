"""The greedy-every-cell walker (greedy_walker.py's docstring says what it is)."""

from vlrl.envs.maze import walker as W


class GreedyWalker(W.DfsWalker):
    """The demonstrator's depth-first walk, its goal-facing order picked again at every cell."""

    def action(self, pos):
        self.order = W.preferred_order(self.maze, at=pos)
        return super().action(pos)


def walk_greedy(maze, max_turns, stop_required):
    return W.walk(maze, max_turns, stop_required=stop_required, walker=GreedyWalker(maze))
