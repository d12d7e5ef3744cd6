"""`vlrl report` on a real (tiny) run: finished, still running, resumed, broken; and the page in Chromium.

One real training of the tiny model (2 GRPO steps, quiet progress) serves every test of the module.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from vlrl.cli import app
from vlrl.config import load_config
from vlrl.errors import VlrlError
from vlrl.report.html import load_run, write_report
from vlrl.training.progress import train_with_progress

pytestmark = pytest.mark.slow  # one real (tiny) training serves the module
ROOT = Path(__file__).resolve().parents[2]
FIGURES = ("learning", "signals", "phases", "throughput")


@pytest.fixture(scope="module")
def finished_run(ci_model_dir, tmp_path_factory) -> tuple[Path, str]:
    """A finished 2-step run (evaluation after step 1 and at the end) and its quiet progress output."""
    root = tmp_path_factory.mktemp("report")
    cfg = load_config(
        ROOT / "configs" / "ci-tiny.yaml",
        [
            f"model.path={ci_model_dir}",
            f"storage.root={root}",
            "runtime.backend=local",
            "train.steps=2",
            "train.eval_every=1",
            "train.eval_tasks=4",
            "env.max_turns=3",
        ],
    )
    out = io.StringIO()
    train_with_progress(cfg, root / "run", quiet=True, console=Console(file=out, width=160))
    return root / "run", out.getvalue()


def _copy_running(run: Path, dest: Path) -> Path:
    """The run as it looked mid-training: no adapter, no evals.json, no checkpoints."""
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns("adapter", "evals.json", "checkpoints", "report*"))
    return dest


def test_quiet_training_logs_one_line_per_step(finished_run):
    _, output = finished_run
    lines = [line for line in output.splitlines() if line.startswith("step ")]
    assert [line.split(" |")[0] for line in lines] == ["step 1/2", "step 2/2"], output
    assert "holdout" in lines[0] and re.search(r"eta \d+:\d\d$", lines[1])
    assert "logprob" not in lines[0] or "optim" in lines[0]


def test_report_of_a_finished_run(finished_run, tmp_path):
    run, _ = finished_run
    out = tmp_path / "page" / "run.html"
    result = CliRunner().invoke(app, ["report", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "finished" in page and "Run run" in page
    # self-contained: the PNGs are inside the page, the same bytes as the files written beside it
    embedded = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(embedded) == len(FIGURES)
    for key, data in zip(FIGURES, embedded):
        png = out.with_name(f"run-{key}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and base64.b64decode(data) == png
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page) and "<script" not in page
    # evaluations: step 1 from the step record's eval/* keys, step 2 from evals.json (the final one)
    table = page.split("<h2>Evaluations</h2>")[1].split("</table>")[0]
    rows = re.findall(r"<tr><td>(\d+)</td>", table)
    assert rows == ["1", "2"], rows
    assert "[" in table and "%" in table  # success with its interval
    assert "init_tiny: ci" in page  # the config
    lineage = page.split("<h2>Lineage</h2>")[1].split("<h2>")[0]  # the trainer wrote lineage.json
    assert "config_hash" in lineage and "sha256:" in lineage


def test_report_of_a_running_run_with_a_cut_off_line_and_lineage(finished_run, tmp_path):
    run = _copy_running(finished_run[0], tmp_path / "live")
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward/mean": 0.5, "time/st')  # the trainer is writing this line right now
    (run / "lineage.json").write_text(
        json.dumps(
            {
                "git": {"commit": "0123abcd", "dirty": False},
                "base_model": {"fingerprint": "sha256:feed"},
                "splits": [{"name": "holdout", "seeds": [10000000, 10000032]}],
            }
        )
    )
    data = load_run(run)
    assert [h["step"] for h in data.history] == [1, 2] and not data.finished
    assert [e["step"] for e in data.evals] == [1]  # from eval/* of step 1
    page = write_report(run).read_text()
    assert "running or stopped" in page and "incomplete" in page
    for cell in ("git.commit", "0123abcd", "base_model.fingerprint", "splits[0].seeds", "10000000, 10000032"):
        assert cell in page, cell
    assert (run / "report-phases.png").is_file()


def test_a_resumed_run_shows_each_step_once_with_its_latest_record(finished_run, tmp_path):
    run = _copy_running(finished_run[0], tmp_path / "resumed")
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({**last, "reward/mean": 0.987654}) + "\n")
    data = load_run(run)
    assert [h["step"] for h in data.history] == [1, 2] and data.history[-1]["reward/mean"] == 0.987654
    assert any("recorded twice" in n for n in data.notes)


def test_a_run_without_steps_yet(tmp_path):
    (tmp_path / "config.yaml").write_text("train:\n  steps: 5\n")
    page = write_report(tmp_path).read_text()
    assert "No step has finished yet" in page and "0 / 5" in page


def test_evaluations_saved_before_task_groups_show_their_per_size_success(tmp_path):
    # evals.json as runs wrote it before task groups: per-size success under `success_by_size`, no group_label
    (tmp_path / "config.yaml").write_text("train:\n  steps: 2\n")
    (tmp_path / "evals.json").write_text(
        json.dumps(
            [
                {
                    "step": 2,
                    "label": "step 2",
                    "split": "holdout",
                    "decoding": "greedy",
                    "n": 8,
                    "successes": 3,
                    "success_rate": 0.375,
                    "success_low": 0.137,
                    "success_high": 0.694,
                    "mean_turns": 4.0,
                    "invalid_rate": 0.25,
                    "success_by_size": {"3": 0.75, "5": 0.0},
                    "env": "maze",
                }
            ]
        )
    )
    table = write_report(tmp_path).read_text().split("<h2>Evaluations</h2>")[1].split("</table>")[0]
    assert "<th>success by size</th>" in table, table
    assert re.findall(r"<tr><td>(\d+)</td>", table) == ["2"] and "<td>3: 75.0%, 5: 0.0%</td>" in table, table


def test_bad_input_is_one_clear_error_and_keeps_what_exists(finished_run, tmp_path):
    with pytest.raises(VlrlError, match="does not exist"):
        write_report(tmp_path / "nope")
    with pytest.raises(VlrlError, match="not a vlrl run directory"):
        write_report(tmp_path)
    run = _copy_running(finished_run[0], tmp_path / "broken")
    good = write_report(run).read_text()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0][:20], *lines[1:]]) + "\n")
    with pytest.raises(VlrlError, match=r"metrics.jsonl:1 is not a JSON record"):
        write_report(run)
    assert (run / "report.html").read_text() == good  # the earlier report is untouched
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "evals.json").write_text("[{")
    with pytest.raises(VlrlError, match="evals.json is not valid JSON"):
        write_report(run)
    (run / "evals.json").unlink()
    with pytest.raises(VlrlError, match="is a directory"):
        write_report(run, tmp_path)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert result.exit_code != 0 and isinstance(result.exception, VlrlError)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's `chromium` is not installed: run scripts/setup-system.sh as root (make system)"
)
def test_report_renders_in_headless_chromium(finished_run, tmp_path):
    """The page as a browser draws it: a screenshot that is not blank (plots, tables, text).

    Set VLRL_REPORT_SCREENSHOT=/some/path.png to keep the screenshot.
    """
    from PIL import Image

    page = write_report(finished_run[0], tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--disable-extensions",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,3600",
        f"--screenshot={shot}",
        page.as_uri(),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # chromium's helper processes, if any outlived it
        except ProcessLookupError:
            pass
    assert shot.is_file(), log.decode(errors="replace")[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 3600)
    small = image.resize((320, 900))
    pixels = list(small.getdata())
    inked = sum(1 for p in pixels if min(p) < 200) / len(pixels)
    colors = len(set(pixels))
    assert inked > 0.05 and colors > 100, f"blank-looking screenshot: {inked:.1%} inked, {colors} colours"
    keep = os.environ.get("VLRL_REPORT_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
