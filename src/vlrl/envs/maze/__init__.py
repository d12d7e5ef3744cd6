"""The image maze: perfect mazes drawn as pictures, played one move per turn or as a whole plan.

Two layouts: `cells` (thin wall lines) and `blocks` (walls are whole blocks, the reference).

Importing this package registers the `maze`, `maze_plan` and `maze_look` environments. See docs/maze.md.
"""

from vlrl.envs.maze.drills import MazeLookEnv, MazePlanEnv
from vlrl.envs.maze.env import PROMPT_TEXTS, MazeEnv, parse_action, parse_plan
from vlrl.envs.maze.generate import generate_maze
from vlrl.envs.maze.maze import LAYOUTS, Maze, check_perfect
from vlrl.envs.maze.oracle import distances_to, next_action, optimal_actions, shortest_path
from vlrl.envs.maze.render import THEMES, ascii_maze, render
from vlrl.envs.maze.splits import Split, maze_bucket, maze_for_task, overlapping_tasks

__all__ = [
    "PROMPT_TEXTS",
    "MazeEnv",
    "MazeLookEnv",
    "MazePlanEnv",
    "parse_action",
    "parse_plan",
    "LAYOUTS",
    "Maze",
    "check_perfect",
    "generate_maze",
    "distances_to",
    "next_action",
    "optimal_actions",
    "shortest_path",
    "THEMES",
    "ascii_maze",
    "render",
    "Split",
    "maze_bucket",
    "maze_for_task",
    "overlapping_tasks",
]
