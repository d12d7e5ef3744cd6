"""`vlrl train` on the default Ray backend: it starts a local Ray instance, trains, and stops it;
a wrong --address is one clear line, fast."""

from __future__ import annotations

import json
import os
import socket
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported: nodes on 127.0.0.1

import pytest
from typer.testing import CliRunner

ray = pytest.importorskip("ray")

from vlrl.cli import app  # noqa: E402
from vlrl.errors import VlrlError  # noqa: E402


@pytest.fixture
def no_ray(monkeypatch):
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield
    if ray.is_initialized():
        ray.shutdown()


def test_cli_train_runs_on_a_local_ray_instance(no_ray, ci_model_dir, tmp_path):
    runs = tmp_path / "runs"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "configs/ci-tiny.yaml",
            f"model.path={ci_model_dir}",
            f"storage.root={runs}",
            "storage.run_name=on-ray",
            "train.steps=2",
            "train.eval_tasks=4",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    run = runs / "on-ray"
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert "runtime:\n  backend: ray" in (run / "config.yaml").read_text()
    assert not ray.is_initialized()  # the CLI stopped the instance it started


def test_wrong_address_is_one_line_and_fast(no_ray, ci_model_dir, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    result = CliRunner().invoke(
        app,
        [
            "train",
            "configs/ci-tiny.yaml",
            f"model.path={ci_model_dir}",
            f"storage.root={tmp_path}",
            "--address",
            f"127.0.0.1:{port}",
        ],
    )
    assert isinstance(result.exception, VlrlError)
    assert "cannot reach a Ray cluster at 127.0.0.1" in str(result.exception) and "\n" not in str(result.exception)
    assert time.perf_counter() - start < 15
