"""bench/maze_turn_errors.py: each turn of a block-maze trace classified against the oracle."""

from __future__ import annotations

import gzip
import json

from tests.conftest import load_bench
from vlrl.envs.base import make_env
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.envs.maze.maze import MOVES
from vlrl.envs.maze.splits import adhoc_task


def _trace(seed: int, responses) -> dict:
    config = MazeEnvConfig(
        name="maze", layout="blocks", sizes=[9], placement="corners", max_turns=18, stop_required=True
    )
    env = make_env(config)
    env.reset(adhoc_task(9, seed, layout="blocks", placement="corners"))
    for respond in responses:
        if env.step(respond(env)).done:
            break
    return env.trace()


def _wall(env) -> str:
    return "<action>" + next(m for m in MOVES if env.maze.move(env.pos, m) is None) + "</action>"


def _away(env) -> str:
    d = env.dist
    for m in MOVES:
        nxt = env.maze.move(env.pos, m)
        if nxt is not None and d[nxt[0]][nxt[1]] > d[env.pos[0]][env.pos[1]]:
            return f"<action>{m}</action>"
    raise AssertionError("no move away from the goal")


def test_turns_are_classified_and_first_moves_counted(tmp_path):
    bench = load_bench("maze_turn_errors")
    oracle = lambda env: env.oracle_response()  # noqa: E731
    # a bump, then the oracle to the goal and its stop
    first = _trace(0, [_wall] + [oracle] * 17)
    kinds = bench.classify(first)
    assert kinds[0] == "bump" and kinds[-1] == "stop" and set(kinds[1:-1]) == {"good"}
    # one oracle move, a move back (a wrong branch), junk, an early stop
    second = _trace(1, [oracle, _away, lambda env: "junk", lambda env: "<action>stop</action>"])
    assert bench.classify(second) == ["good", "wrong branch", "invalid", "stop off goal"]

    path = tmp_path / "traces.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    summary = bench.summarise(str(path))
    assert summary["episodes"] == 2 and summary["first_error"] == {"bump": 1, "wrong branch": 1}
    assert summary["turns"]["bump"] == 1 and summary["turns"]["invalid"] == 1
    assert summary["accuracy_by_turn"][0] == 0.5  # the bump, and the second trace's good move
    starts = summary["first_move_by_start"]
    assert sum(sum(c.values()) for c in starts.values()) == 2
    assert any("(bump)" in k for c in starts.values() for k in c)
