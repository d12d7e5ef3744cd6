"""What each turn of maze evaluation traces did, against the oracle: a good move (one step closer
to the goal), a wrong branch (open, but away from the goal), a bump (into a wall), a stop
(on or off the goal); and whether the first move depends on the walls or only on the start.

"While winnable" counts only the turns taken while the goal could still be reached (and stopped
on) in the turns left: late turns are mostly turns of episodes already lost, so the right-move rate
of all turns by turn number mixes skill with selection (it can make a model look worse at late
turns, where every model may be near perfect while the goal is still reachable).

A model that cannot see the walls still learns the start corner's commonest first move: the
first table then shows one move per start, whatever the maze.

    python bench/maze_turn_errors.py EVAL/sft/traces.jsonl.gz [MORE_TRACES...] [--json turns.json]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict

from vlrl.envs.maze.maze import Maze
from vlrl.envs.maze.oracle import distances_to
from vlrl.eval.verify import read_traces

MOVES = ("up", "down", "left", "right")


def classify(trace: dict) -> list[str]:
    """The kind of every turn of one maze trace (either layout), judged by the env's own maze and BFS."""
    maze = Maze.from_json(trace["maze"])
    dist, pos, kinds = distances_to(maze, maze.goal), maze.start, []
    for turn in trace["turns"]:
        action = turn.get("action")
        if action not in MOVES:
            kinds.append(("stop" if pos == maze.goal else "stop off goal") if action == "stop" else "invalid")
        else:
            nxt = maze.move(pos, action)
            kinds.append(
                "bump" if nxt is None else "good" if dist[nxt[0]][nxt[1]] < dist[pos[0]][pos[1]] else "wrong branch"
            )
        pos = tuple(turn["position"])
    return kinds


def winnable_turns(trace: dict) -> list[bool]:
    """For every turn: could the goal still be reached, with the `stop` where required, in the turns left?"""
    maze = Maze.from_json(trace["maze"])
    settings = trace.get("settings", {})
    max_turns, stop = settings.get("max_turns", len(trace["turns"])), 1 if settings.get("stop_required", True) else 0
    dist, pos, out = distances_to(maze, maze.goal), maze.start, []
    for i, turn in enumerate(trace["turns"]):
        out.append(dist[pos[0]][pos[1]] + stop <= max_turns - i)
        pos = tuple(turn["position"])
    return out


def summarise(path: str) -> dict:
    traces = read_traces(path)
    kinds, first_error, first_moves = Counter(), Counter(), defaultdict(Counter)
    by_turn: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    by_turn_winnable: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    first_error_turn, lost_turns = Counter(), 0
    for trace in traces:
        if not trace["turns"]:
            continue
        turns, winnable = classify(trace), winnable_turns(trace)
        kinds.update(turns)
        wrong = next((k for k in turns if k not in ("good", "stop")), None)
        if wrong:
            first_error[wrong] += 1
        for t, (kind, open_) in enumerate(zip(turns, winnable)):
            by_turn[t][0] += kind in ("good", "stop")
            by_turn[t][1] += 1
            if open_:
                by_turn_winnable[t][0] += kind in ("good", "stop")
                by_turn_winnable[t][1] += 1
            lost_turns += not open_
        first = next(
            (t for t, (kind, open_) in enumerate(zip(turns, winnable)) if open_ and kind not in ("good", "stop")), None
        )
        if first is not None:
            first_error_turn[first] += 1
        start = tuple(trace["maze"]["start"])
        first_moves[str(start)][f"{trace['turns'][0].get('action')} ({turns[0]})"] += 1
    return {
        "file": path,
        "episodes": len(traces),
        "turns": dict(kinds),
        "first_error": dict(first_error),
        "accuracy_by_turn": {t: round(ok / n, 3) for t, (ok, n) in sorted(by_turn.items())},
        "turns_after_goal_out_of_reach": lost_turns,
        "accuracy_by_turn_while_winnable": {
            t: [round(ok / n, 3), n] for t, (ok, n) in sorted(by_turn_winnable.items())
        },
        "first_mistake_turn_while_winnable": dict(sorted(first_error_turn.items())),
        "first_move_by_start": {s: dict(c) for s, c in sorted(first_moves.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="traces.jsonl or traces.jsonl.gz of `vlrl eval`")
    parser.add_argument("--json", help="write the summaries here")
    args = parser.parse_args()
    out = [summarise(p) for p in args.traces]
    for s in out:
        total = sum(s["turns"].values()) or 1
        print(f"{s['file']}: {s['episodes']} episodes, {total} turns")
        print(
            "  turns:",
            ", ".join(f"{k} {v} ({100 * v / total:.0f}%)" for k, v in sorted(s["turns"].items(), key=lambda x: -x[1])),
        )
        print("  first mistake:", s["first_error"])
        print("  right moves by turn:", " ".join(f"{t}:{a:.2f}" for t, a in s["accuracy_by_turn"].items()))
        print(
            f"  turns after the goal was out of reach: {s['turns_after_goal_out_of_reach']} "
            f"({100 * s['turns_after_goal_out_of_reach'] / total:.0f}%)"
        )
        print(
            "  right moves by turn while winnable (rate, turns):",
            " ".join(f"{t}:{a:.2f}({n})" for t, (a, n) in s["accuracy_by_turn_while_winnable"].items()),
        )
        print("  first mistake while winnable, at turn:", s["first_mistake_turn_while_winnable"])
        for start, moves in s["first_move_by_start"].items():
            print(f"  first move from {start}:", moves)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
