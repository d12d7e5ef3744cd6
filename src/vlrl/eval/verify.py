"""Re-verify an evaluation from its traces alone: `vlrl eval-verify DIR`.

Every trace holds what the agent faced (the maze: its JSON) and the model's raw responses. Replaying them through the
environment (`envs.base.replay_trace`) recomputes each episode's success and return without any
model; the recomputed success count must equal the one in summary.json. The replayed tasks are
also checked against the training split by content (for the maze, by wall layout), so a
reader can confirm that none of the evaluated tasks was a training task.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlrl.envs.base import Task, env_class, replay_trace
from vlrl.errors import VlrlError


@dataclass
class VerifyReport:
    """What replaying one traces.jsonl found."""

    traces_file: str
    n: int
    successes_replayed: int
    successes_recorded: int | None  # from summary.json next to the traces, if present
    mismatched: list[str] = field(default_factory=list)  # task ids whose replay differs from the trace
    in_train_split: list[str] = field(default_factory=list)  # task ids whose content is a training task's

    @property
    def ok(self) -> bool:
        """Every trace replays as recorded, the counts agree, and no task is a training task."""
        agree = self.successes_recorded is None or self.successes_recorded == self.successes_replayed
        return not self.mismatched and not self.in_train_split and agree


def _train_overlap(traces: list[dict[str, Any]]) -> list[str]:
    tasks = [Task.from_json(t["task"]) for t in traces if t.get("task", {}).get("split") != "train"]
    if not tasks:
        return []
    cls = env_class(tasks[0].env)
    found = cls.train_overlap(cls.config_class(name=tasks[0].env), tasks)
    if found is None:
        return []  # listing a whole training split needs its config; the protocol checked it before evaluating
    return [t.task_id for t in found]


TRACE_FILES = ("traces.jsonl", "traces.jsonl.gz")  # as `vlrl eval -o` writes it, and as bench/ archives it


def read_traces(traces_file: str | Path) -> list[dict[str, Any]]:
    """The episode traces of a traces.jsonl, or of a gzipped one (a name ending in .gz), in file order.

    Blank lines are skipped; a line that is not JSON, or a file that is missing or not gzip where
    its name says so, is a VlrlError naming the file (and the line).
    """
    path = Path(traces_file)
    if not path.is_file():
        raise VlrlError(f"{path} does not exist or is not a file; pass a traces.jsonl or traces.jsonl.gz")
    try:
        with gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else path.open(encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (
        OSError,
        EOFError,
        zlib.error,
        UnicodeDecodeError,
    ) as exc:  # BadGzipFile is an OSError, a cut-off gzip an EOFError
        raise VlrlError(
            f"{path} could not be read as {'gzip' if path.name.endswith('.gz') else 'text'} ({exc})"
        ) from None
    traces = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            traces.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise VlrlError(f"{path}:{i} is not valid JSON ({exc.msg})") from None
    return traces


def verify_traces(traces_file: str | Path) -> VerifyReport:
    """Replay every trace of a traces.jsonl (or .jsonl.gz) and compare with its summary.json, if any."""
    path = Path(traces_file)
    traces = read_traces(path)
    replays = [replay_trace(t) for t in traces]
    recorded = None
    summary_file = path.with_name("summary.json")
    if summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        recorded = summary.get("successes")
        if recorded is None and "success_rate" in summary:  # summaries written before `successes` existed
            recorded = round(summary["success_rate"] * summary.get("n", 0))
        if summary.get("n") is not None and summary["n"] != len(traces):
            raise VlrlError(f"{summary_file} counts {summary['n']} episodes but {path} has {len(traces)} traces")
    return VerifyReport(
        traces_file=str(path),
        n=len(traces),
        successes_replayed=sum(bool(r["success"]) for r in replays),
        successes_recorded=recorded,
        mismatched=[
            t["task"].get("env", "?") + "/" + "/".join(str(t["task"].get(k)) for k in ("split", "index", "seed"))
            for t, r in zip(traces, replays)
            if not r["matches"]
        ],
        in_train_split=_train_overlap(traces),
    )


def verify_eval_dir(path: str | Path) -> list[VerifyReport]:
    """Verify every traces.jsonl (or traces.jsonl.gz) under `path` (a `vlrl eval --out` folder), or one traces file."""
    p = Path(path)
    if p.is_file():
        return [verify_traces(p)]
    if not p.is_dir():
        raise VlrlError(f"{p} does not exist; pass a `vlrl eval --out` folder or a traces.jsonl")
    files = sorted(f for name in TRACE_FILES for f in p.rglob(name))
    if not files:
        raise VlrlError(f"no traces.jsonl (or traces.jsonl.gz) under {p}")
    return [verify_traces(f) for f in files]
