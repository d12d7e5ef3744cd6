"""Pair greedy evaluations on the CPU demo's holdout mazes task by task (McNemar), with the walker's own play.

usage: python pair.py NAME=TRACES.jsonl ... > paired.json
Each NAME is paired with every later NAME and with the walker (train.sft.demonstrator of configs/demo-cpu.yaml)
on the same tasks (the `vlrl eval` traces' split and index).
"""

from __future__ import annotations

import json
import sys

from vlrl.config import load_config
from vlrl.envs.base import build_split
from vlrl.eval.evaluate import task_key
from vlrl.eval.stats import pair_outcomes
from vlrl.training.sft import demonstrator_result


def trace_outcomes(path: str) -> dict[str, bool]:
    rows = [json.loads(line) for line in open(path)]
    return {f"{r['task']['split']}/{r['task']['index']}": bool(r["success"]) for r in rows}


def main() -> None:
    named = dict(arg.split("=", 1) for arg in sys.argv[1:])
    outcomes = {name: trace_outcomes(path) for name, path in named.items()}
    n = len(next(iter(outcomes.values())))
    config = load_config("configs/demo-cpu.yaml")
    tasks = build_split(config.env, "holdout")[:n]
    walk = demonstrator_result(config, tasks).outcomes()
    by_key = {task_key(t): f"holdout/{i}" for i, t in enumerate(tasks)}
    outcomes["walker"] = {by_key[k]: v for k, v in walk.items()}
    names = list(outcomes)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            rows.append({"a": a, "b": b, **pair_outcomes(outcomes[a], outcomes[b], a, b).to_json()})
    json.dump(rows, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
