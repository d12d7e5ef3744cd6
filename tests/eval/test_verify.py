"""Reading and re-verifying evaluation traces (vlrl.eval.verify): plain and gzipped traces.jsonl."""

from __future__ import annotations

import gzip
import json

import pytest

from vlrl.envs.base import make_env
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.envs.maze.splits import adhoc_task
from vlrl.errors import VlrlError
from vlrl.eval.verify import read_traces, verify_eval_dir


def _traces() -> list[dict]:
    """Three 9x9 maze episodes played without a model: the oracle twice, junk once (out of turns)."""
    config = MazeEnvConfig(name="maze", sizes=[9], max_turns=30)
    traces = []
    for seed in range(3):
        env = make_env(config)
        env.reset(adhoc_task(9, seed))
        while not env.step(env.oracle_response() if seed != 1 else "junk").done:
            pass
        traces.append(env.trace())
    return traces


def test_read_traces_reads_plain_and_gzipped_files_alike(tmp_path):
    traces = _traces()
    text = json.dumps(traces[0]) + "\n\n" + "".join(json.dumps(t) + "\n" for t in traces[1:])  # a blank line is skipped
    plain, packed = tmp_path / "traces.jsonl", tmp_path / "traces.jsonl.gz"
    plain.write_text(text, encoding="utf-8")
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write(text)
    assert read_traces(plain) == read_traces(str(packed)) == traces


def test_read_traces_names_the_file_and_line_it_cannot_read(tmp_path):
    bad = tmp_path / "traces.jsonl"
    bad.write_text('{"turns": []}\nnot json\n')
    with pytest.raises(VlrlError, match=r"traces.jsonl:2 is not valid JSON"):
        read_traces(bad)
    with pytest.raises(VlrlError, match="does not exist"):
        read_traces(tmp_path / "missing.jsonl")
    not_gzip = tmp_path / "plain.jsonl.gz"
    not_gzip.write_text('{"turns": []}\n')
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(b'{"turns": []}\n' * 100)[:40])
    for path in (not_gzip, cut):
        with pytest.raises(VlrlError, match=f"{path.name} could not be read as gzip"):
            read_traces(path)


def test_eval_verify_replays_gzipped_traces_and_checks_their_summary(tmp_path):
    traces = _traces()
    model = tmp_path / "eval" / "sft"
    model.mkdir(parents=True)
    with gzip.open(model / "traces.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(t) + "\n" for t in traces))
    (model / "summary.json").write_text(json.dumps({"n": 3, "successes": 2}))
    (report,) = verify_eval_dir(tmp_path / "eval")  # a folder: its traces.jsonl.gz are found as traces.jsonl are
    assert (report.n, report.successes_replayed, report.successes_recorded, report.mismatched) == (3, 2, 2, [])
    assert verify_eval_dir(model / "traces.jsonl.gz")[0].successes_replayed == 2  # one file
    (model / "summary.json").write_text(json.dumps({"n": 3, "successes": 3}))
    assert not verify_eval_dir(tmp_path / "eval")[0].ok  # the count in summary.json is still compared
