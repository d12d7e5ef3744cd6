"""Fixtures of the tracking tests: one short real GRPO run tracked in MLflow (SQLite), per session."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]


def ci_overrides(model_dir: Path, root: Path, *extra: str) -> list[str]:
    return [f"model.path={model_dir}", f"storage.root={root}", "runtime.backend=local", *extra]


@pytest.fixture(scope="session")
def tracked_run(ci_model_dir, tmp_path_factory):
    """A 2-step GRPO run on the tiny model with tracking on: the trainer's own integration
    (training/telemetry.py) starts the tracker, logs every step and evaluation, and ends it."""
    from vlrl.config import load_config
    from vlrl.tracking import read_lineage
    from vlrl.training.trainer import GRPOTrainer

    root = tmp_path_factory.mktemp("tracked") / "runs"
    cfg = load_config(
        ROOT / "configs" / "ci-tiny.yaml",
        ci_overrides(
            ci_model_dir,
            root,
            "train.steps=2",
            "train.checkpoint_every=1",
            "train.eval_tasks=2",
            "env.max_turns=3",
            "algo.group_size=2",
            "algo.tasks_per_step=1",
            "algo.mini_batch_size=2",
            "algo.micro_batch_size=2",
            "tracking.enabled=true",
            "storage.run_name=grpo",
        ),
    )
    run_dir = root / "grpo"
    steps, during = [], []

    def on_step(m):  # what lineage.json says while the run is going
        steps.append(m.step)
        during.append((run_dir / "lineage.json").read_text())

    with mock.patch.dict(os.environ, {"VLRL_CONTAINER_IMAGE": "vlrl:test-image"}):
        with GRPOTrainer(cfg, run_dir, on_step=on_step) as trainer:
            trainer.setup()
            adapter = trainer.train()
    lineage = read_lineage(run_dir)
    return SimpleNamespace(
        config=cfg,
        root=root,
        run_dir=run_dir,
        adapter=adapter,
        db=root / "mlflow.db",
        run_id=lineage["tracking"]["run_id"],
        lineage=lineage,
        start_lineage=during[0],
        steps=steps,
    )


@pytest.fixture
def reg_config(ci_model_dir, tmp_path):
    """`reg_config(*overrides)`: the ci config writing under tmp_path, with a short lock timeout."""
    from vlrl.config import load_config

    def make(*overrides: str):
        return load_config(
            ROOT / "configs" / "ci-tiny.yaml",
            ci_overrides(ci_model_dir, tmp_path / "runs", "registry.lock_timeout_s=0.5", *overrides),
        )

    return make
