"""Checkpoints across worker counts and a worker killed mid-run, on a real two-node Ray cluster
(`ray.cluster_utils.Cluster`, 1 CPU per node, one worker per node).

The reference is an uninterrupted 3-step run on 2 workers with a checkpoint every step. Resharding
loads its checkpoint on 1 worker (and that one's back on 2) and compares the full adapter and
optimizer state bit for bit. The kill test SIGKILLs a worker actor's process in the middle of the
same run: the trainer rebuilds the group, reloads the newest checkpoint and finishes, with the
same final adapter and per-step metrics as the reference.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported: nodes on 127.0.0.1

import pytest
import torch

ray = pytest.importorskip("ray")

from ray_helpers import two_node_cluster  # noqa: E402
from run_compare import same, step_numbers  # noqa: E402

from vlrl.config import load_config  # noqa: E402
from vlrl.training.trainer import GRPOTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RUN = [
    "train.steps=3",
    "train.checkpoint_every=1",
    "train.keep_checkpoints=3",
    "env.max_turns=2",
    "rollout.max_new_tokens=4",
    "train.eval_tasks=2",
    "runtime.torch_threads=1",
    "runtime.placement_timeout_s=180",
]


def _config(model_dir, root, *overrides):
    return load_config(
        ROOT / "configs" / "ci-tiny.yaml", [f"model.path={model_dir}", f"storage.root={root}", *RUN, *overrides]
    )


# restarts differ by design between a killed run and the reference
RECORD_SKIP = ("time/", "throughput/", "run/")


def _state(trainer) -> dict:
    """Full adapter, optimizer (name-keyed, gathered from the shards) and scheduler state."""
    return {"adapter": trainer.worker.adapter_state(), **trainer.worker.training_state()}


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["adapter"].keys() == b["adapter"].keys()
    assert all(torch.equal(a["adapter"][k], b["adapter"][k]) for k in a["adapter"])
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    assert all(torch.equal(sa[n][k], sb[n][k]) for n in sa for k in sa[n])
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["scheduler"] == b["scheduler"]


@pytest.fixture(scope="module")
def cluster():
    with two_node_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def reference(cluster, ci_model_dir, tmp_path_factory):
    """3 steps on 2 workers, uninterrupted (the workers are released before the tests run)."""
    root = tmp_path_factory.mktemp("reference")
    trainer = GRPOTrainer(_config(ci_model_dir, root, "runtime.num_workers=2"), root / "two")
    try:
        trainer.setup()
        trainer.train()
        return {"run": root / "two", "state": _state(trainer), "history": trainer.history}
    finally:
        trainer.close()


def test_reshard_2_to_1_and_1_to_2(reference, ci_model_dir, tmp_path):
    one = GRPOTrainer(_config(ci_model_dir, tmp_path, "runtime.num_workers=1"), tmp_path / "one")
    try:
        one.setup()
        one.load_checkpoint(str(reference["run"] / "checkpoints" / "step-000003"))  # written by 2 workers
        _assert_same_state(_state(one), reference["state"])
        one.step()  # it trains on: step 4 on 1 worker
        one.save_checkpoint()
        after_one = _state(one)
    finally:
        one.close()
    optimizer = tmp_path / "one" / "checkpoints" / "step-000004" / "optimizer"
    assert sorted(p.name for p in optimizer.iterdir()) == [".metadata", "__0_0.distcp"]

    two = GRPOTrainer(_config(ci_model_dir, tmp_path, "runtime.num_workers=2"), tmp_path / "two")
    try:
        two.setup()
        two.load_checkpoint(str(tmp_path / "one"))  # written by 1 worker
        _assert_same_state(_state(two), after_one)
        two.step()
        two.save_checkpoint()
        assert [h["step"] for h in two.history] == [1, 2, 3, 4, 5]
    finally:
        two.close()
    shards = sorted(p.name for p in (tmp_path / "two" / "checkpoints" / "step-000005" / "optimizer").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # each worker wrote its own shard


class KillingTrainer(GRPOTrainer):
    """The trainer, with a SIGKILL to one worker actor's process at a chosen call: worker 1
    as the first group starts step 2's update, worker 0 as the second group writes step 2's
    optimizer shards (a checkpoint half-written by the workers)."""

    plan = [("update", 1, 1), ("save_optimizer_state", 0, 2)]  # (call, rank to kill, trainer.step_idx then)

    def _make_workers(self):
        group = super()._make_workers()
        if self.plan:
            method, rank, at_step = self.plan.pop(0)
            original, pid = getattr(group, method), group.pids()[rank]

            def kill_then_call(*args, **kwargs):
                if self.step_idx == at_step and pid not in self.killed:
                    self.killed.append(pid)
                    os.kill(pid, signal.SIGKILL)
                return original(*args, **kwargs)

            setattr(group, method, kill_then_call)
        return group


def test_killed_workers_are_replaced_and_the_run_ends_as_if_nothing_happened(reference, ci_model_dir, tmp_path):
    """Two deaths in one run, each noticed by the call it interrupts: the group is rebuilt, the
    newest valid checkpoint (step 1 both times: the second death leaves step 2 half-written)
    reloaded, and the final adapter, optimizer and every per-step metric equal the uninterrupted
    run's, bit for bit."""
    trainer = KillingTrainer(_config(ci_model_dir, tmp_path, "runtime.num_workers=2"), tmp_path / "killed")
    trainer.killed = []
    try:
        trainer.setup()
        trainer.train()
        assert len(trainer.killed) == 2 and trainer.restarts == 2
        assert not set(trainer.worker.pids()) & set(trainer.killed)
        final = _state(trainer)
    finally:
        trainer.close()
    _assert_same_state(final, reference["state"])
    assert same(step_numbers(trainer.history, RECORD_SKIP), step_numbers(reference["history"], RECORD_SKIP))
    assert [h["run/restarts"] for h in trainer.history] == [0.0, 2.0, 2.0]  # step 1 ran before any restart
    run = tmp_path / "killed"
    events = [json.loads(line) for line in (run / "run-events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["step"], e["restarts"]) for e in events] == [("restart", 1, 1), ("restart", 1, 2)]
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "latest",
        "step-000001",
        "step-000002",
        "step-000003",
    ]


def test_no_restart_beyond_max_restarts(ci_model_dir, tmp_path):
    from vlrl.errors import VlrlError, WorkerDiedError

    trainer = GRPOTrainer(_config(ci_model_dir, tmp_path, "runtime.max_restarts=0"), tmp_path / "run")
    with pytest.raises(
        VlrlError, match=r"^worker 1 died during update; not restarting again \(runtime.max_restarts=0\)$"
    ):
        trainer.recover(WorkerDiedError("worker 1 died during update"))
