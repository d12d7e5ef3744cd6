"""bench/reference_step.py: one GPU's share of the 6-GPU config through the trainer, on CPU with the tiny model."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    name = "vlrl_reference_step"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "reference_step.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_the_share_of_the_6gpu_config_keeps_its_optimizer_steps():
    from vlrl.config import load_config

    ref = _script()
    config = load_config(ROOT / "configs" / "qwen3vl-8b-6gpu.yaml", ["model.path=/nonexistent"])
    overrides, share = ref.share_overrides(config)
    # 32 tasks x 8 over 6 GPUs: 6 tasks (48 episodes) each; 256 / 64 = 4 optimizer steps -> mini-batch 12,
    # micro-batches of 6 (the largest divisor of 12 up to the configured 8).
    assert share == {
        "workers": 6,
        "tasks_per_step": 6,
        "episodes_per_step": 48,
        "optimizer_steps_per_batch": 4,
        "mini_batch_size": 12,
        "micro_batch_size": 6,
    }
    assert overrides == ["algo.tasks_per_step=6", "algo.mini_batch_size=12", "algo.micro_batch_size=6"]


def test_summary_takes_the_phase_split_from_the_trainers_records():
    ref = _script()
    records = [
        {"step": 1, "time/step_s": 9.0, "time/rollout_s": 6.0, "time/update_s": 3.0},
        {"step": 2, "time/step_s": 4.0, "time/rollout_s": 3.0, "time/update_s": 1.0, "throughput/x": 2.0},
    ]
    s = ref.summarize(records, warmup=1)
    assert s["measured_steps"] == [2] and s["step_s"] == 4.0
    assert s["phases_s"] == {"rollout_s": 3.0, "update_s": 1.0} and s["phase_share"]["rollout_s"] == 0.75


@pytest.mark.parametrize("via_cli", [False, True])
def test_cpu_smoke_writes_step_time_phases_and_memory(tmp_path, via_cli):
    ref = _script()
    out = tmp_path / "ref.json"
    argv = [
        "--config",
        str(ROOT / "configs" / "ci-tiny.yaml"),
        "--workers",
        "2",
        "--model-dir",
        str(tmp_path / "model"),
        "--init-tiny",
        "ci",
        "--device",
        "cpu",
        "--engine",
        "transformers",
        "--steps",
        "1" if via_cli else "2",
        "--run-root",
        str(tmp_path / "runs"),
        "--out",
        str(out),
        "model.dtype=float32",
        "env.max_turns=2",
        "rollout.max_new_tokens=4",
    ]
    if via_cli:
        argv.append("--via-cli")
    assert ref.main(argv) == 0
    result = json.loads(out.read_text())
    assert "stopped" not in result
    assert result["workload"]["share_of"]["tasks_per_step"] == 1  # ci-tiny's 2 tasks over 2 workers
    assert len(result["steps"]) == (1 if via_cli else 2)
    summary = result["summary"]
    assert summary["step_s"] > 0 and summary["measured_steps"] == ([1] if via_cli else [2])
    assert {"rollout_s", "generate_s", "update_s", "sync_s"} <= set(summary["phases_s"])
    assert summary["episodes_per_step"] == pytest.approx(4)
    assert result["memory"]["host_peak_rss_gib"] > 0
    if via_cli:
        assert (tmp_path / "runs" / "reference-transformers" / "adapter").is_dir()  # the whole `vlrl train`
