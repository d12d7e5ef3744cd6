"""What each first move is worth to a policy: every legal first move forced (algo.exploring_starts, group 4), the
rest played by the policy at temperature T (the transformers engine samples n > 1 only, so near-greedy is T 0.001),
on the first N holdout mazes. The group's other episodes sample their first move.

usage (from the checkout's root): PYTHONPATH=src python forced_first_move.py START ADAPTER|none N T > forced.json
Then `summary.py --forced forced.json probs.json` (probs.json: first_move_probs.py of the same policy) counts the
mazes whose policy first move is wrong and whose oracle first move, followed by the policy, succeeds in every try.
"""

from __future__ import annotations

import json
import sys

from vlrl.config import load_config
from vlrl.envs.base import build_split, make_env
from vlrl.rollout.engine import SamplingParams
from vlrl.training.worker import Worker


def main() -> None:
    start, adapter, n, temperature = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    overrides = [f"model.path={start}", "model.init_tiny=null", "tracking.enabled=false", "runtime.torch_threads=2"]
    cfg = load_config("configs/demo-cpu.yaml", overrides + ["algo.exploring_starts=true"])
    worker = Worker(cfg, total_optimizer_steps=1, adapter_dir=None if adapter == "none" else adapter)
    tasks = list(build_split(cfg.env, "holdout"))[:n]
    params = worker.sampling_params(seed=0)
    episodes = worker.rollout(tasks, 4, SamplingParams(**{**params.__dict__, "temperature": temperature}))
    rows = []
    for g, task in enumerate(tasks):
        env = make_env(cfg.env)
        env.reset(task)
        by_first: dict[str, list[float]] = {}
        for e in episodes[4 * g : 4 * g + 4]:
            by_first.setdefault(e.trace["turns"][0]["response"], []).append(e.metrics["success"])
        rows.append({"index": task.index, "oracle": env.oracle_response(), "by_first": by_first})
    json.dump(rows, sys.stdout)


if __name__ == "__main__":
    main()
