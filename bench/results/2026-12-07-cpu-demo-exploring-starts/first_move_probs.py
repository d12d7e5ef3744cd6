"""How sure a policy is of its first move: P(each move) at the first turn of the first N mazes of a split.

usage (from the checkout's root): PYTHONPATH=src python first_move_probs.py START ADAPTER|none N [SPLIT [OVERRIDE ...]]
    > probs.json
START: the model directory (e.g. sftL_0); ADAPTER: a LoRA adapter directory on it, or none (the start itself).
Scores the four responses `<action>MOVE</action>` on each maze's first prompt with the policy (configs/demo-cpu.yaml);
`summary.py` turns the files into argmax accuracy against the oracle, mean P(oracle move) and mean entropy.
"""

from __future__ import annotations

import json
import sys

import torch

from vlrl.config import load_config
from vlrl.envs.base import build_split, make_env
from vlrl.envs.maze.maze import MOVES
from vlrl.training.worker import Worker


def main() -> None:
    start, adapter, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    split = sys.argv[4] if len(sys.argv) > 4 else "holdout"
    overrides = [f"model.path={start}", "model.init_tiny=null", "tracking.enabled=false", "runtime.torch_threads=2"]
    cfg = load_config("configs/demo-cpu.yaml", overrides + sys.argv[5:])
    worker = Worker(cfg, total_optimizer_steps=1, adapter_dir=None if adapter == "none" else adapter)
    rows = []
    for task in list(build_split(cfg.env, split))[:n]:
        env = make_env(cfg.env)
        prompt = worker.chat.prompt(env.system_prompt, env.reset(task))
        seqs = []
        for move in MOVES:
            seq = prompt.copy()
            ids = worker.chat.response_ids(f"<action>{move}</action>")
            seq.append_sampled(ids, [0.0] * len(ids))
            seqs.append(seq)
        scored = worker.policy.score_no_grad(seqs, with_adapter=adapter != "none")
        logp = [float(lp[torch.tensor(s.loss_mask[1:], dtype=torch.bool)].sum()) for s, lp in zip(seqs, scored)]
        rows.append(
            {
                "index": task.index,
                "logp": dict(zip(MOVES, logp)),
                "oracle": env.oracle_response(),
                "legal": env.legal_responses(),
            }
        )
    json.dump(rows, sys.stdout)


if __name__ == "__main__":
    main()
