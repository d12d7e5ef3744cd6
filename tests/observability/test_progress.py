"""Live progress and the quiet one-line-per-step mode, fed step records (no model needed).

The quiet mode inside a real training run is exercised by tests/report/test_report.py.
"""

from __future__ import annotations

import io
import re

from rich.console import Console

from vlrl.training.progress import LiveProgress, QuietProgress, StepClock, format_duration, step_line
from vlrl.training.trainer import StepMetrics

VALUES = {
    "reward/mean": 0.25,
    "reward/std": 0.4,
    "episode/success": 0.125,
    "train/kl": 0.0021,
    "train/entropy": 1.234,
    "throughput/rollout_tokens_per_s": 321.0,
    "throughput/train_tokens_per_s": 4567.0,
    "throughput/episodes_per_s": 2.5,
    "time/step_s": 3.2,
    "time/generate_s": 1.5,
    "time/env_s": 0.2,
    "time/logprob_s": 0.3,
    "time/optim_s": 0.9,
    "time/sync_s": 0.05,
}
EVAL = {"eval/success_rate": 0.5, "eval/success_low": 0.25, "eval/success_high": 0.75}


def test_step_line_has_the_numbers_of_the_display():
    line = step_line(StepMetrics(3, {**VALUES, **EVAL}), total=10, eta=125)
    for part in (
        "step 3/10",
        "reward 0.250",
        "success 12.5%",
        "kl 0.0021",
        "321 tok/s rollout",
        "4567 tok/s train",
        "generate 1.5s",
        "env 0.2s",
        "logprob 0.3s",
        "optim 0.9s",
        "sync 0.1s",
        "holdout 50.0% [25%, 75%]",
        "eta 2:05",
    ):
        assert part in line, (part, line)
    assert "ckpt" not in line  # phases the record lacks are not shown as 0


def test_quiet_mode_prints_one_unwrapped_line_per_step():
    out = io.StringIO()
    quiet = QuietProgress(Console(file=out, width=80), total=4)
    quiet.on_step(StepMetrics(1, VALUES))
    quiet.on_step(StepMetrics(2, VALUES))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("step 1/4 |") and lines[1].startswith("step 2/4 |")
    assert re.search(r"eta \d+:\d\d$", lines[1])


def test_live_display_shows_bar_numbers_and_holdout():
    out = io.StringIO()
    console = Console(file=out, width=140, force_terminal=True, color_system=None)
    with LiveProgress(console, total=5, start_step=2) as live:
        live.on_step(StepMetrics(3, {**VALUES, **EVAL}))
        live.on_step(StepMetrics(4, VALUES))
    text = out.getvalue()
    for part in (
        "GRPO",
        "4/5",
        "reward 0.250 ± 0.400",
        "success 12.5%",
        "321 tok/s rollout",
        "optim 0.9s",
        "holdout",
        "50.0% [25%, 75%] at step 3",
        "eta",
    ):
        assert part in text, part


def test_eta_counts_only_this_process_steps():
    clock = StepClock(total=10, start_step=4)  # resumed at step 4
    assert clock.eta(4) is None
    clock.started -= 6.0  # 6 s for 2 steps -> 3 s a step, 4 steps left
    assert abs(clock.eta(6) - 12.0) < 0.5
    assert format_duration(None) == "?" and format_duration(59) == "0:59" and format_duration(3725) == "1:02:05"
