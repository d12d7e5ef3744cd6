#!/usr/bin/env python
"""What a policy that sees the gui screens but cannot read their labels would score.

Levels 2 and 3 name their target by the label drawn next to it (`Turn on "Wi-Fi"`, `Type "Paris"
into the "City" field`). A policy that finds every control and the highlighted Save button, and
copies the word from the instruction, but cannot match the instruction's label to the text in
the picture, can only guess among the candidates: the controls (level 2) or the text fields
(level 3). Its expected success on a task is 1 / candidates; this script averages that over a
split of a config, with the level and screen size given on the command line.

With --traces (evaluation traces of level-2 episodes, `vlrl eval -o DIR` writes DIR/MODEL/traces.jsonl; .gz too)
it also counts which control each episode's first click hit, top to bottom: a model that reads
clicks the target's row; one that does not tends to click the same row whatever the instruction.

    python bench/gui_label_blind.py -c configs/gui-cpu.yaml --level 2 --size 128 --split holdout
    python bench/gui_label_blind.py --level 2 --size 128 --traces EVAL/sft/traces.jsonl.gz
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from vlrl.config import load_config
from vlrl.envs.base import build_split
from vlrl.envs.gui.splits import app_for_task
from vlrl.eval.verify import read_traces

CANDIDATES = {2: ("toggle", "checkbox"), 3: ("textfield",)}


def label_blind_chance(config_path: str, level: int, size: int, split: str) -> dict:
    config = load_config(config_path, [f"env.levels=[{level}]", f"env.width={size}", f"env.height={size}"])
    tasks = build_split(config.env, split)
    chances, counts = [], Counter()
    for task in tasks:
        app = app_for_task(task)
        n = sum(w.kind in CANDIDATES[level] for s in app.screens for w in s.widgets)
        chances.append(1 / n)
        counts[n] += 1
    return {
        "config": config_path,
        "level": level,
        "screen": f"{size}x{size}",
        "split": split,
        "tasks": len(tasks),
        "candidates": {str(k): v for k, v in sorted(counts.items())},
        "label_blind_success": round(sum(chances) / len(chances), 4),
    }


def first_clicks(path: str) -> dict:
    """Level 2: the row (0 = top control) each episode's first click hit, and the target's row."""
    clicked, target, success = Counter(), Counter(), 0
    for trace in read_traces(path):
        controls = [w["id"] for s in trace["app"]["screens"] for w in s["widgets"] if w["kind"] in CANDIDATES[2]]
        first = trace["turns"][0]
        clicked[str(controls.index(first["widget"])) if first["widget"] in controls else first["effect"]] += 1
        target[str(controls.index(next(iter(trace["app"]["goal"]["set"]))))] += 1
        success += bool(trace["success"])
    n = sum(target.values())
    return {
        "traces": path,
        "episodes": n,
        "success": round(success / n, 4),
        "first_click_row": dict(sorted(clicked.items())),
        "target_row": dict(sorted(target.items())),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", default="configs/gui-cpu.yaml")
    ap.add_argument("--level", type=int, choices=sorted(CANDIDATES), default=2)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--split", default="holdout")
    ap.add_argument("--traces", nargs="*", default=[], help="level-2 evaluation traces.jsonl files")
    args = ap.parse_args()
    out = label_blind_chance(args.config, args.level, args.size, args.split)
    if args.traces:
        out["models"] = [first_clicks(p) for p in args.traces]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
