"""Pair greedy evaluations on the CPU demo's holdout mazes task by task (McNemar), with a demonstrator's own play.

usage: python pair.py [--demonstrator NAME] [--seed S] NAME=TRACES.jsonl ... > paired.json
Each NAME is paired with every later NAME and with the demonstrator (default: configs/demo-cpu.yaml's
train.sft.demonstrator; `walker_random` draws its orders from train.seed S, as the SFT of that seed did)
on the same tasks (the `vlrl eval` traces' split and index).
"""

from __future__ import annotations

import argparse
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--demonstrator", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("runs", nargs="+", help="NAME=TRACES.jsonl")
    args = parser.parse_args()
    named = dict(arg.split("=", 1) for arg in args.runs)
    outcomes = {name: trace_outcomes(path) for name, path in named.items()}
    n = len(next(iter(outcomes.values())))
    overrides = [f"train.seed={args.seed}"]
    if args.demonstrator:
        overrides.append(f"train.sft.demonstrator={args.demonstrator}")
    config = load_config("configs/demo-cpu.yaml", overrides)
    tasks = build_split(config.env, "holdout")[:n]
    walk = demonstrator_result(config, tasks).outcomes()
    by_key = {task_key(t): f"holdout/{i}" for i, t in enumerate(tasks)}
    outcomes[config.train.sft.demonstrator] = {by_key[k]: v for k, v in walk.items()}
    names = list(outcomes)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            rows.append({"a": a, "b": b, **pair_outcomes(outcomes[a], outcomes[b], a, b).to_json()})
    json.dump(rows, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
