"""Summaries of first_move_probs.py and forced_first_move.py files.

usage: python summary.py NAME=probs.json ...                       first-move argmax accuracy, P(oracle), entropy,
                                                                   and the first moves each later NAME fixed or
                                                                   broke against the first
       python summary.py --forced forced.json probs.json            what forcing the first move is worth
"""

from __future__ import annotations

import json
import math
import re
import sys


def probs(row: dict) -> dict[str, float]:
    z = math.log(sum(math.exp(v) for v in row["logp"].values()))
    return {k: math.exp(v - z) for k, v in row["logp"].items()}


def move(response: str) -> str:
    return re.search(r"<action>(\w+)</action>", response).group(1)


def accuracy(files: list[str]) -> dict:
    out = {}
    first_right: list[bool] | None = None  # per maze, the first file's (the start's) first move is the oracle's
    for arg in files:
        name, path = arg.split("=", 1)
        rows = json.load(open(path))
        p = [probs(r) for r in rows]
        oracle = [move(r["oracle"]) for r in rows]
        right = [max(q, key=q.get) == o for q, o in zip(p, oracle)]
        out[name] = {
            "mazes": len(rows),
            "argmax_is_oracle": sum(right) / len(rows),
            "mean_p_oracle": sum(q[o] for q, o in zip(p, oracle)) / len(rows),
            "mean_entropy_nats": sum(-sum(x * math.log(x) for x in q.values() if x > 0) for q in p) / len(rows),
        }
        if first_right is None:
            first_right = right
        else:  # against the first file, maze by maze (the same tasks in the same order)
            out[name]["wrong_to_right"] = sum(not a and b for a, b in zip(first_right, right))
            out[name]["right_to_wrong"] = sum(a and not b for a, b in zip(first_right, right))
    return out


def forced(path: str, probs_path: str) -> dict:
    p = {r["index"]: r for r in json.load(open(probs_path))}
    c = {
        "mazes": 0,
        "legal_first_moves": {},
        "policy_first_is_oracle": 0,
        "policy_first_wrong": 0,
        "wrong_first_policy_path_succeeds": 0,
        "wrong_first_oracle_first_then_policy_succeeds": 0,
        "right_first_succeeds": 0,
        "some_first_move_always_succeeds": 0,
    }
    for r in json.load(open(path)):
        q = probs(p[r["index"]])
        top = f"<action>{max(q, key=q.get)}</action>"
        rate = {k: sum(v) / len(v) for k, v in r["by_first"].items()}
        c["mazes"] += 1
        legal = str(len(p[r["index"]]["legal"]))
        c["legal_first_moves"][legal] = c["legal_first_moves"].get(legal, 0) + 1
        c["some_first_move_always_succeeds"] += max(rate.values()) == 1
        if top == r["oracle"]:
            c["policy_first_is_oracle"] += 1
            c["right_first_succeeds"] += rate.get(r["oracle"]) == 1
        else:
            c["policy_first_wrong"] += 1
            c["wrong_first_policy_path_succeeds"] += rate.get(top) == 1
            c["wrong_first_oracle_first_then_policy_succeeds"] += rate.get(r["oracle"]) == 1
    return c


if __name__ == "__main__":
    args = sys.argv[1:]
    result = forced(args[1], args[2]) if args[0] == "--forced" else accuracy(args)
    json.dump(result, sys.stdout, indent=1)
    print()
