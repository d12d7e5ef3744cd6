"""The run report: one self-contained HTML page (plots embedded as PNG) from a run directory.

    vlrl report RUN_DIR [--out FILE]        (default FILE: RUN_DIR/report.html)

What it reads, all optional except that there must be a run there:

    metrics.jsonl   one record per step (the trainer's); the last line may be cut off while the
                    run is still writing it: it is skipped and the page says so
    evals.json      holdout evaluations (written when the run finishes); before that, the
                    eval/* keys of metrics.jsonl give the evaluation points
    config.yaml     the resolved config of the run
    lineage.json    what produced the run (any JSON; shown as a table)
    run-events.jsonl  resumes, restarts and stability guard events (a table of the guard events
                    and the rollbacks they caused)
    adapter/        present once the run has finished

What it writes: the HTML page and, next to it, the same plots as PNG files
(`<stem>-learning.png`, `-signals.png`, `-phases.png`, `-throughput.png`).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlrl.errors import VlrlError


@dataclass
class RunData:
    """What a run directory holds, read leniently where a running run may be mid-write."""

    run_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    config_text: str | None = None
    config: dict[str, Any] | None = None
    lineage: Any = None
    guard_events: list[dict[str, Any]] = field(default_factory=list)  # run-events.jsonl: "guard" and "rollback"
    finished: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def total_steps(self) -> int | None:
        try:
            return int(self.config["train"]["steps"])  # type: ignore[index]
        except (TypeError, KeyError, ValueError):
            return None


def read_metrics(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    """metrics.jsonl -> one record per step (the latest when a resumed run wrote a step twice)."""
    lines = path.read_text(errors="replace").splitlines()
    by_step: dict[int, dict[str, Any]] = {}
    repeated = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # being written right now
                notes.append("the last line of metrics.jsonl is incomplete (the run is writing it) and was skipped")
                continue
            raise VlrlError(f"{path}:{number} is not a JSON record ({exc.msg}); the metrics file is damaged") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise VlrlError(f"{path}:{number} has no integer 'step'; is this a vlrl metrics file?")
        repeated += record["step"] in by_step
        by_step[record["step"]] = record
    if repeated:
        notes.append(
            f"{repeated} step(s) were recorded twice (the run was resumed from a checkpoint); the latest records "
            "are shown"
        )
    return [by_step[s] for s in sorted(by_step)]


def read_guard_events(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    """The stability guards' lines of run-events.jsonl (their events and the rollbacks they caused)."""
    out = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            notes.append(f"line {number} of run-events.jsonl is not a JSON record and was skipped")
            continue
        if isinstance(event, dict) and event.get("event") in ("guard", "rollback"):
            out.append(event)
    return out


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VlrlError(f"{path} is not valid JSON ({exc}); the file is damaged") from None


def evals_from_history(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluation points carried by step records (eval/* keys), as summaries with a step."""
    out = []
    for h in history:
        if "eval/success_rate" in h:
            point = {k[len("eval/") :]: v for k, v in h.items() if k.startswith("eval/")}
            out.append({"step": h["step"], "label": f"step {h['step']}", "split": "holdout", **point})
    return out


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory (finished or still running); VlrlError when there is no run there."""
    root = Path(run_dir)
    if not root.is_dir():
        raise VlrlError(f"run directory {root} does not exist")
    metrics, evals_file, config_file = root / "metrics.jsonl", root / "evals.json", root / "config.yaml"
    if not (metrics.is_file() or config_file.is_file()):
        raise VlrlError(f"{root} holds no metrics.jsonl and no config.yaml: not a vlrl run directory")
    data = RunData(root)
    if metrics.is_file():
        data.history = read_metrics(metrics, data.notes)
    if config_file.is_file():
        import yaml

        data.config_text = config_file.read_text()
        try:
            parsed = yaml.safe_load(data.config_text)
            data.config = parsed if isinstance(parsed, dict) else None
        except yaml.YAMLError:
            data.notes.append("config.yaml could not be parsed; shown as text")
    recorded = evals_from_history(data.history)
    if evals_file.is_file():
        final = _read_json(evals_file)
        if not isinstance(final, list):
            raise VlrlError(f"{evals_file} should hold a list of evaluations")
        steps = {e.get("step") for e in final if isinstance(e, dict)}
        data.evals = sorted(
            [e for e in recorded if e["step"] not in steps] + [e for e in final if isinstance(e, dict)],
            key=lambda e: e.get("step") or 0,
        )
    else:
        data.evals = recorded
    if (root / "lineage.json").is_file():
        data.lineage = _read_json(root / "lineage.json")
    if (root / "run-events.jsonl").is_file():
        data.guard_events = read_guard_events(root / "run-events.jsonl", data.notes)
    data.finished = (root / "adapter").is_dir() and evals_file.is_file()
    return data


# -- rendering -------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.4g}"
    return str(value)


def _pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) and not math.isnan(value) else "–"


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested JSON as (dotted key, scalar) rows; lists of scalars stay one row."""
    if isinstance(value, dict):
        rows: list[tuple[str, Any]] = []
        for k, v in value.items():
            rows += flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return rows or [(prefix, "{}")]
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        rows = []
        for i, v in enumerate(value):
            rows += flatten(v, f"{prefix}[{i}]")
        return rows
    if isinstance(value, list):
        return [(prefix, ", ".join(_fmt(v) for v in value))]
    return [(prefix, value)]


def _table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def evaluations_table(evals: list[dict[str, Any]]) -> str:
    """The evaluations as an HTML table: success with its 95% interval, turns, invalid rate, per task group."""
    rows = []
    labels = set()
    for e in evals:
        by_group = e.get("success_by_group", e.get("success_by_size"))  # success_by_size: summaries before task groups
        labels.add(e.get("group_label", "size" if "success_by_size" in e else "group"))
        sizes = ", ".join(f"{k}: {_pct(v)}" for k, v in by_group.items()) if isinstance(by_group, dict) else "–"
        ci = f"[{_pct(e.get('success_low'))}, {_pct(e.get('success_high'))}]" if "success_low" in e else ""
        rows.append(
            [
                html.escape(_fmt(e.get("step", "–"))),
                html.escape(str(e.get("label", ""))),
                html.escape(str(e.get("split", ""))),
                html.escape(str(e.get("decoding", "greedy"))),
                html.escape(_fmt(e.get("n", "–"))),
                f"<b>{_pct(e.get('success_rate'))}</b> {ci}",
                html.escape(_fmt(e.get("mean_turns", "–"))),
                _pct(e.get("invalid_rate")),
                html.escape(sizes),
            ]
        )
    return _table(
        [
            "step",
            "label",
            "split",
            "decoding",
            "n",
            "success [95% CI]",
            "mean turns",
            "invalid / turn",
            f"success by {labels.pop() if len(labels) == 1 else 'group'}",
        ],
        rows,
    )


def guard_events_table(events: list[dict[str, Any]]) -> str:
    """Guard events and the rollbacks they caused, in the order they happened."""
    rows = []
    for e in events:
        when = (
            dt.datetime.fromtimestamp(e["time"]).strftime("%Y-%m-%d %H:%M:%S")
            if isinstance(e.get("time"), (int, float))
            else "–"
        )
        if e["event"] == "rollback":
            what = (
                f"rolled back to {e.get('checkpoint')} (step {e.get('step')}); learning rate x "
                f"{_fmt(e.get('lr_scale'))}"
            )
            rows.append(
                [html.escape(when), "–", html.escape(str(e.get("check", ""))), "rollback done", html.escape(what)]
            )
        else:
            rows.append(
                [
                    html.escape(when),
                    html.escape(_fmt(e.get("step", "–"))),
                    html.escape(str(e.get("check", ""))),
                    f"<b>{html.escape(str(e.get('action', '')))}</b>",
                    html.escape(str(e.get("message", ""))),
                ]
            )
    return _table(["time", "step", "check", "action", "what it saw"], rows)


def steps_table(history: list[dict[str, Any]], last: int = 12) -> str:
    """The latest steps' key numbers."""
    cols = [
        ("reward/mean", "reward", _fmt),
        ("episode/success", "success", _pct),
        ("train/kl", "KL", _fmt),
        ("train/entropy", "entropy", _fmt),
        ("rollout/logprob_diff_mean", "sampler |Δ|", _fmt),
        ("rollout/kl_sampler_trainer_k3", "KL(sampler‖trainer)", _fmt),
        ("throughput/rollout_tokens_per_s", "rollout tok/s", lambda v: f"{v:.0f}"),
        ("throughput/train_tokens_per_s", "train tok/s", lambda v: f"{v:.0f}"),
        ("time/step_s", "step s", lambda v: f"{v:.1f}"),
    ]
    rows = [[str(h["step"])] + [html.escape(f(h[k])) if k in h else "–" for k, _, f in cols] for h in history[-last:]]
    return _table(["step"] + [c[1] for c in cols], rows, "numbers")


def _summary_cards(data: RunData) -> str:
    h = data.history
    total = data.total_steps
    done = h[-1]["step"] if h else 0
    wall = sum(float(r.get("time/step_s", 0.0)) for r in h)
    cards = [("steps", f"{done} / {total}" if total else str(done)), ("time in steps", _duration(wall))]
    if h:
        tail = h[-5:]
        cards.append(("reward (last 5 steps)", _fmt(sum(r.get("reward/mean", 0.0) for r in tail) / len(tail))))
        cards.append(("train success (last 5)", _pct(sum(r.get("episode/success", 0.0) for r in tail) / len(tail))))
    if data.evals:
        e = data.evals[-1]
        cards.append(
            (
                f"holdout success (step {e.get('step', '?')})",
                f"{_pct(e.get('success_rate'))} [{_pct(e.get('success_low'))}, {_pct(e.get('success_high'))}]",
            )
        )
    return "".join(
        f'<div class="card"><div class="k">{html.escape(k)}</div><div class="v">{html.escape(v)}</div></div>'
        for k, v in cards
    )


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


CSS = """
body{font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:24px
auto;max-width:1180px;color:#1d2330;padding:0 16px}
h1{margin-bottom:4px} h2{margin-top:32px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
.sub{color:#5b6475} .status{display:inline-block;padding:2px 10px;border-radius:10px;font-size:13px;font-weight:600}
.finished{background:#d8f3dc;color:#1b5e20} .running{background:#fff3cd;color:#7a5200}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0} .card{background:#f4f6fa;border-radius:8px;padding:10px
14px;min-width:150px}
.card .k{font-size:12px;color:#5b6475} .card .v{font-size:20px;font-weight:600}
img{max-width:100%;border:1px solid #e5e8ef;border-radius:6px;margin:8px 0}
table{border-collapse:collapse;font-size:13px;margin:8px 0} th,td{border:1px solid #dde2ea;padding:4px
8px;text-align:left;vertical-align:top}
th{background:#f4f6fa} td{word-break:break-word;max-width:640px} table.numbers td{text-align:right}
pre{background:#f4f6fa;padding:12px;border-radius:6px;overflow:auto;font-size:12px;max-height:480px}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:6px 10px;margin:6px 0;font-size:13px}
"""


def render_html(data: RunData, images: dict[str, bytes]) -> str:
    """The page: header and status, summary, plots (embedded PNG), evaluations, steps, config, lineage."""
    name = data.run_dir.resolve().name
    if data.finished:
        status = '<span class="status finished">finished</span>'
    else:
        metrics = data.run_dir / "metrics.jsonl"
        age = f", last step written {_duration(time.time() - metrics.stat().st_mtime)} ago" if metrics.is_file() else ""
        status = f'<span class="status running">running or stopped{html.escape(age)}</span>'
    made = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>vlrl run {html.escape(name)}</title>",
        f"<style>{CSS}</style></head><body>",
        (
            f"<h1>Run {html.escape(name)}</h1><div class='sub'>{status} &nbsp; {html.escape(str(data.run_dir))} · "
            f"report made {made}</div>"
        ),
    ]
    parts += [f"<div class='note'>{html.escape(n)}</div>" for n in data.notes]
    parts.append(f"<div class='cards'>{_summary_cards(data)}</div>")
    captions = {
        "learning": (
            "Learning curve: training reward and success per step; holdout success (greedy) at each evaluation with "
            "its 95% Wilson interval."
        ),
        "signals": "Training signals per step.",
        "phases": "Where the time goes: each step's seconds by phase (stacked; 'other' is the rest of the step).",
        "throughput": "Throughput against wall-clock time.",
    }
    if images:
        parts.append("<h2>Plots</h2>")
        for key, png in images.items():
            encoded = base64.b64encode(png).decode()
            parts.append(
                f"<figure><img alt='{key}' src='data:image/png;base64,{encoded}'><figcaption class='sub'>"
                f"{html.escape(captions.get(key, key))}</figcaption></figure>"
            )
    else:
        parts.append("<p class='sub'>No step has finished yet: nothing to plot.</p>")
    parts.append("<h2>Evaluations</h2>")
    parts.append(evaluations_table(data.evals) if data.evals else "<p class='sub'>No evaluation yet.</p>")
    parts.append("<h2>Stability guards</h2>")
    parts.append(
        guard_events_table(data.guard_events)
        if data.guard_events
        else "<p class='sub'>No guard event (train.guards; run-events.jsonl).</p>"
    )
    if data.history:
        parts.append(f"<h2>Latest steps</h2>{steps_table(data.history)}")
    parts.append("<h2>Lineage</h2>")
    if data.lineage is not None:
        rows = [[html.escape(k), html.escape(_fmt(v))] for k, v in flatten(data.lineage)]
        parts.append(_table(["field", "value"], rows))
    else:
        parts.append("<p class='sub'>No lineage.json in the run directory.</p>")
    parts.append("<h2>Config</h2>")
    parts.append(
        f"<pre>{html.escape(data.config_text)}</pre>" if data.config_text else "<p class='sub'>No config.yaml.</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of a run (and its PNG plots next to it); returns the HTML path."""
    from vlrl.report import plots

    data = load_run(run_dir)
    out_path = Path(out) if out is not None else Path(run_dir) / "report.html"
    if out_path.is_dir():
        raise VlrlError(f"--out {out_path} is a directory; name the HTML file to write")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    images: dict[str, bytes] = {}
    if data.history:
        final = [e for e in data.evals if "success_low" in e and "success_high" in e and "step" in e]
        figures = {
            "learning": lambda p: plots.learning_curve(
                data.history, final, p, title=f"{data.run_dir.resolve().name}: learning curve"
            ),
            "signals": lambda p: plots.training_signals(data.history, p),
            "phases": lambda p: plots.phase_breakdown(data.history, p),
            "throughput": lambda p: plots.throughput(data.history, p),
        }
        for key, draw in figures.items():
            png = draw(out_path.with_name(f"{out_path.stem}-{key}.png"))
            images[key] = Path(png).read_bytes()
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(render_html(data, images))
    tmp.replace(out_path)  # a browser reloading the page never sees half of it
    return out_path
