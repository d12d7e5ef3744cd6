"""`train.max_minutes`: a time-boxed command checkpoints and stops before a step that would end
past its budget (exit status 75), and the same command with --resume auto finishes the run."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from vlrl.cli import app
from vlrl.errors import TimeLimitReached


def _steps(run) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train_args(ci_model_dir, runs, name: str, *extra: str) -> list[str]:
    """`vlrl train` on the CI config for 3 steps, run `name` under `runs`."""
    return [
        "train",
        "configs/ci-tiny.yaml",
        f"model.path={ci_model_dir}",
        f"storage.root={runs}",
        f"storage.run_name={name}",
        "runtime.backend=local",
        "train.steps=3",
        "train.eval_tasks=2",
        *extra,
        "--quiet",
    ]


def test_time_boxed_run_pauses_and_resumes(ci_model_dir, tmp_path):
    runs = tmp_path / "runs"
    args = _train_args(ci_model_dir, runs, "boxed", "train.checkpoint_every=0", "--resume", "auto")
    # A budget far below one step: the first step always runs, then the run must stop before the second.
    first = CliRunner().invoke(app, [*args, "train.max_minutes=0.0001"])
    assert isinstance(first.exception, TimeLimitReached), first.output
    assert TimeLimitReached.exit_code == 75
    message = str(first.exception)
    assert "after step 1 of 3" in message and "--resume auto" in message and "\n" not in message
    run = runs / "boxed"
    assert _steps(run) == [1]
    assert (run / "checkpoints" / "step-000001").is_dir()  # saved although checkpoint_every is 0
    assert not (run / "adapter").exists()

    second = CliRunner().invoke(app, [*args, "train.max_minutes=60"])  # the budget may change on resume
    assert second.exit_code == 0, second.output
    assert _steps(run) == [1, 2, 3]
    assert (run / "adapter" / "adapter_model.safetensors").is_file()


def test_time_boxed_run_can_finish_instead(ci_model_dir, tmp_path):
    """`train.on_time_limit=finish`: the budget ends the run (an arm of an equal-time comparison):
    exit 0, the final evaluation, checkpoint and adapter at the step the budget reached."""
    runs = tmp_path / "runs"
    args = _train_args(ci_model_dir, runs, "finish", "train.max_minutes=0.0001", "train.on_time_limit=finish")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run = runs / "finish"
    assert _steps(run) == [1]
    assert [e["step"] for e in json.loads((run / "evals.json").read_text())] == [1]
    assert (run / "checkpoints" / "step-000001").is_dir()
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
