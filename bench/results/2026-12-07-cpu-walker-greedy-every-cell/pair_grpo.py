"""Pair the greedy-every-cell walker with greedy evaluations (McNemar), on the mazes in their own traces.

usage: PYTHONPATH=src python pair_grpo.py NAME=TRACES.jsonl ... > paired.json
Each trace row carries its maze, so the walkers play exactly the evaluated tasks.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from greedy_walker_lib import walk_greedy  # noqa: E402

from vlrl.envs.maze import walker as W  # noqa: E402
from vlrl.envs.maze.maze import Maze  # noqa: E402
from vlrl.eval.stats import pair_outcomes  # noqa: E402

rows = []
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    traces = [json.loads(line) for line in open(path)]
    model, greedy, walker = {}, {}, {}
    for t in traces:
        key = f"{t['task']['split']}/{t['task']['index']}"
        maze, s = Maze.from_json(t["maze"]), t["settings"]
        model[key] = bool(t["success"])
        greedy[key] = walk_greedy(maze, s["max_turns"], s["stop_required"])
        walker[key] = W.walk(maze, s["max_turns"], None, s["stop_required"])
    for a, b, oa, ob in ((name, "greedy_walker", model, greedy), ("greedy_walker", "walker", greedy, walker)):
        rows.append({"trace": arg, "a": a, "b": b, **pair_outcomes(oa, ob, a, b).to_json()})
json.dump(rows, sys.stdout, indent=1)
