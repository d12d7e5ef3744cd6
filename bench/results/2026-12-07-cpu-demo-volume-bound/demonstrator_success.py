"""The CPU demo's demonstrators without a model: success within 6 and 5 turns on the first 400 holdout mazes.

usage (from the checkout's root): PYTHONPATH=src python demonstrator_success.py
walker (goal-facing), walker_random (orders from random.Random(i) for maze i), the goal-blind fixed orders
(`blind-u,r,d,l` is walker_blind), and a goal-blind order drawn once per maze.
"""

from __future__ import annotations

import random

from vlrl.config import load_config
from vlrl.envs.base import build_split, make_env
from vlrl.envs.maze.walker import FIXED_ORDER, DfsWalker, walk

for turns in (6, 5):
    cfg = load_config("configs/demo-cpu.yaml", [f"env.max_turns={turns}"])
    split = build_split(cfg.env, "holdout")
    env = make_env(cfg.env)
    mazes = []
    for i in range(400):
        env.reset(split[i])
        mazes.append(env.maze)
    res = {
        "walker": sum(walk(m, turns) for m in mazes),
        "walker_random": sum(walk(m, turns, random.Random(i)) for i, m in enumerate(mazes)),
    }
    for order in [FIXED_ORDER, ("right", "down", "left", "up"), ("down", "right", "up", "left")]:
        res["blind-" + ",".join(o[0] for o in order)] = sum(walk(m, turns, walker=DfsWalker(m, order)) for m in mazes)
    rng = random.Random(0)
    res["blind-random"] = sum(walk(m, turns, walker=DfsWalker(m, tuple(rng.sample(FIXED_ORDER, 4)))) for m in mazes)
    print(turns, {k: v / 400 for k, v in res.items()})
