"""Issue 32, a diagnostic: how far a goal-greedy walker goes without planning.

The `walker` demonstrator fixes its preferred order towards the goal once, at the start. This variant
re-picks the order at every cell (the moves that most shrink the offset to the goal first) and is otherwise
the same depth-first walk. It needs no memory beyond the visited cells and no lookahead: a measure of what a
local choice at each junction can reach, against which GRPO's plateau can be read. First 500 holdout tasks.

    PYTHONPATH=src python bench/results/2026-12-07-cpu-walker-greedy-every-cell/greedy_walker.py > result.json
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from greedy_walker_lib import walk_greedy  # noqa: E402

from vlrl.config import load_config  # noqa: E402
from vlrl.envs.base import build_split  # noqa: E402
from vlrl.envs.maze import maze_for_task  # noqa: E402
from vlrl.envs.maze import walker as W  # noqa: E402

rows = []
for path, extra in (("configs/demo-cpu.yaml", ["env.holdout.count=500"]), ("configs/gpu-maze9.yaml", [])):
    cfg = load_config(path, extra)
    split = build_split(cfg.env, "holdout")
    mazes = [maze_for_task(split[i]) for i in range(500)]
    turns, stop = cfg.env.max_turns, cfg.env.stop_required
    walker = [W.walk(m, turns, None, stop) for m in mazes]
    greedy = [walk_greedy(m, turns, stop) for m in mazes]
    rows.append(
        {
            "config": path,
            "max_turns": turns,
            "n": len(mazes),
            "walker_success": sum(walker) / len(mazes),
            "greedy_every_cell_success": sum(greedy) / len(mazes),
            "greedy_only": sum(g and not w for g, w in zip(greedy, walker)),
            "walker_only": sum(w and not g for g, w in zip(greedy, walker)),
        }
    )
print(json.dumps(rows, indent=1))
