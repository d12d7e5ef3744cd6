#!/usr/bin/env python
"""The gui env's scripted oracle on N apps per level: success rate and optimal turns.

Each app is a training-split task of `configs/gui-cpu.yaml`'s env with `levels` set to one level
and a screen large enough for it (160 x 160 for every level unless --size says otherwise). The
oracle plays every episode through `GuiEnv.step` (the same code path as a model); the run
also replays every trace from its JSON alone and counts mismatches, and (with --adversarial)
does the same on the adversarial split. Optionally writes one example screenshot per level.

    python bench/gui_oracle.py --apps 1000 --adversarial --out gui_oracle.json
    python bench/gui_oracle.py --apps 1000 --images docs/images/gui
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vlrl.envs.base import build_split, make_env, replay_trace
from vlrl.envs.gui.config import GuiEnvConfig
from vlrl.envs.gui.generate import LEVELS


def play(env, task) -> dict:
    env.reset(task)
    while True:
        result = env.step(env.oracle_response())
        if result.done:
            break
    metrics = env.episode_metrics()
    replay = replay_trace(json.loads(json.dumps(env.trace())))
    return {**metrics, "replay_matches": float(replay["matches"])}


def run_level(level: int, apps: int, size: int, split: str) -> dict:
    config = GuiEnvConfig(
        levels=[level],
        width=size,
        height=size,
        max_turns=32,
        stop_required=True,
        **{split: {"seed_start": {"train": 0, "adversarial": 20_000_000}[split], "count": apps}},
    )
    tasks = build_split(config, split)
    env = make_env(config)
    env.render_images = False  # the oracle reads the app state; screenshots are not needed
    start = time.perf_counter()
    rows = [play(env, tasks[i]) for i in range(apps)]
    seconds = time.perf_counter() - start
    n = len(rows)
    turns: dict[int, int] = {}
    for r in rows:
        turns[int(r["optimal_turns"])] = turns.get(int(r["optimal_turns"]), 0) + 1
    return {
        "level": level,
        "split": split,
        "apps": n,
        "size": size,
        "success_rate": sum(r["success"] for r in rows) / n,
        "turns_equal_optimal": sum(r["turns"] == r["optimal_turns"] for r in rows) / n,
        "mean_optimal_turns": sum(r["optimal_turns"] for r in rows) / n,
        "optimal_turns_histogram": dict(sorted(turns.items())),
        "replay_matches": sum(r["replay_matches"] for r in rows) / n,
        "seconds": round(seconds, 2),
    }


EXAMPLES = [  # (file name, level, size, theme, moved): one screenshot per level, then adversarial looks
    ("level1.png", 1, 96, "light", False),
    ("level2.png", 2, 160, "light", False),
    ("level3.png", 3, 160, "light", False),
    ("level4.png", 4, 160, "light", False),
    ("adversarial-noise-level1.png", 1, 96, "noise", False),
    ("adversarial-dark-level2.png", 2, 160, "dark", False),
    ("adversarial-contrast-level3.png", 3, 192, "contrast", False),
    ("adversarial-moved-level4.png", 4, 160, "light", True),
]


def write_examples(folder: Path, seed: int = 3) -> None:
    """The first screenshot of one app per example, plus level 4's screen after the oracle's first actions."""
    from vlrl.envs.gui.splits import adhoc_task

    folder.mkdir(parents=True, exist_ok=True)
    for name, level, size, theme, moved in EXAMPLES:
        config = GuiEnvConfig(levels=[level], width=size, height=size, theme=theme, max_turns=16)
        env = make_env(config)
        obs = env.reset(adhoc_task(level, seed, width=size, height=size, theme=theme, moved=moved))
        obs.images[0].save(folder / name)
        print(f"wrote {folder / name}: {obs.text.split(' The screen')[0]}")
        if name == "level4.png":  # the other tab, after the oracle's first actions there
            for _ in range(3):
                env.step(env.oracle_response())
            env.screenshot().save(folder / "level4-after-3-actions.png")
            print(f"wrote {folder / 'level4-after-3-actions.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--apps", type=int, default=1000, help="apps per level")
    parser.add_argument("--size", type=int, default=160, help="square screen side in pixels")
    parser.add_argument("--adversarial", action="store_true", help="also run the adversarial split")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    parser.add_argument("--images", type=Path, help="write example screenshots of each level into this folder")
    args = parser.parse_args()
    if args.images:
        write_examples(args.images)
    results = []
    for split in ("train", "adversarial") if args.adversarial else ("train",):
        for level in LEVELS:
            row = run_level(level, args.apps, args.size, split)
            results.append(row)
            print(
                f"{split:11s} level {level}: {row['apps']} apps, oracle success {row['success_rate']:.1%}, "
                f"turns = optimal {row['turns_equal_optimal']:.1%}, mean optimal turns {row['mean_optimal_turns']:.2f} "
                f"{row['optimal_turns_histogram']}, replays matching {row['replay_matches']:.1%}, {row['seconds']} s"
            )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
