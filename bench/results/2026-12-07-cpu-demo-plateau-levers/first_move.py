"""Where GRPO's greedy failures part from the oracle-SFT policy's wins, on the same holdout mazes.

usage: python first_move.py GRPO_TRACES ORACLE_SFT_TRACES ARM_A_TRACES > first_move.json
For every maze the GRPO arm fails and the oracle-SFT model (LoRA, 87.25%) solves: the first turn where their
moves differ, the oracle-SFT model's path length, and whether the GRPO arm played exactly arm A's moves.
"""

from __future__ import annotations

import collections
import json
import sys


def load(path: str) -> dict[int, dict]:
    return {r["task"]["index"]: r for r in map(json.loads, open(path))}


def main() -> None:
    grpo, oracle, arm_a = (load(p) for p in sys.argv[1:4])
    diverge, path_len, same_as_a = collections.Counter(), collections.Counter(), collections.Counter()
    for i, g in grpo.items():
        if g["success"] or not oracle[i]["success"]:
            continue
        moves = [t["action"] for t in g["turns"]]
        oracle_moves = [t["action"] for t in oracle[i]["turns"]]
        first = next((k for k, (x, y) in enumerate(zip(moves, oracle_moves)) if x != y), None)
        diverge[str(first)] += 1
        path_len[str(len(oracle_moves))] += 1
        same_as_a[str(moves == [t["action"] for t in arm_a[i]["turns"]])] += 1
    json.dump(
        {
            "grpo_fails_oracle_sft_wins": sum(diverge.values()),
            "first_differing_turn": dict(sorted(diverge.items())),
            "oracle_sft_path_turns": dict(sorted(path_len.items())),
            "same_moves_as_arm_a": dict(same_as_a),
        },
        sys.stdout,
        indent=1,
    )
    print()


if __name__ == "__main__":
    main()
