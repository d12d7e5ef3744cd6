"""A real two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`, 1 CPU per node):
one worker per node (STRICT_SPREAD), FSDP2 across the nodes, a short training run to the end."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported: nodes on 127.0.0.1

import pytest

ray = pytest.importorskip("ray")

from ray_helpers import two_node_cluster  # noqa: E402

from vlrl.config import load_config  # noqa: E402
from vlrl.training.trainer import GRPOTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_nodes():
    with two_node_cluster() as cluster:
        yield cluster


def test_two_node_cluster_trains(two_nodes, ci_model_dir, tmp_path):
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    cfg = load_config(
        ROOT / "configs" / "ci-tiny.yaml",
        [
            f"model.path={ci_model_dir}",
            f"storage.root={tmp_path / 'runs'}",
            "train.steps=2",
            "train.eval_tasks=4",
            "runtime.num_workers=2",
            "runtime.placement_strategy=STRICT_SPREAD",
            "runtime.placement_timeout_s=60",
        ],
    )
    with GRPOTrainer(cfg, tmp_path / "runs" / "two-nodes") as trainer:
        trainer.setup()
        assert len(set(trainer.worker.node_ids)) == 2  # one worker on each node
        adapter = trainer.train()
    assert (adapter / "adapter_model.safetensors").is_file()
    steps = [json.loads(line) for line in (tmp_path / "runs" / "two-nodes" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all("train/loss" in s and s["time/sync_s"] > 0 for s in steps)
    assert (tmp_path / "runs" / "two-nodes" / "checkpoints" / "latest").is_file()
    # close() gave both CPUs back
    assert ray.available_resources().get("CPU", 0) == 2 or _eventually_free()


def _eventually_free() -> bool:
    import time

    for _ in range(50):
        if ray.available_resources().get("CPU", 0) == 2:
            return True
        time.sleep(0.2)
    return False
