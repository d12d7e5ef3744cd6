"""`WorkerGroup` is the whole interface between the trainer and its workers: the in-process
`Worker` and the Ray `RayWorkerGroup` both satisfy it, and the trainer calls nothing else."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from vlrl.runtime.worker_api import WorkerGroup
from vlrl.runtime.worker_group import RayWorkerGroup
from vlrl.training.worker import Worker

SRC = Path(__file__).resolve().parents[2] / "src" / "vlrl"
MEMBERS = sorted(
    name for name, value in vars(WorkerGroup).items() if inspect.isfunction(value) and not name.startswith("_")
)


def test_the_protocol_lists_the_calls_of_one_step_and_of_checkpoints():
    assert {"rollout", "update", "sync_adapter", "evaluate", "adapter_state", "save_optimizer_state", "close"} <= set(
        MEMBERS
    )


@pytest.mark.parametrize("implementation", [Worker, RayWorkerGroup], ids=lambda c: c.__name__)
@pytest.mark.parametrize("member", MEMBERS)
def test_each_worker_kind_takes_every_call_as_the_protocol_makes_it(implementation, member):
    wanted = inspect.signature(getattr(WorkerGroup, member))
    method = getattr(implementation, member, None)
    assert callable(method), f"{implementation.__name__} has no {member}"
    have = inspect.signature(method)
    wanted_params, have_params = list(wanted.parameters.values()), list(have.parameters.values())
    # The protocol's parameters, in its order, with its defaults; anything more must be optional.
    assert [p.name for p in have_params[: len(wanted_params)]] == [p.name for p in wanted_params]
    for p, q in zip(wanted_params, have_params):
        assert q.default == p.default, (
            f"{implementation.__name__}.{member}({q.name}) default {q.default!r}, protocol {p.default!r}"
        )
    assert all(q.default is not inspect.Parameter.empty for q in have_params[len(wanted_params) :])
    assert have.return_annotation == wanted.return_annotation


def test_the_trainer_calls_its_workers_only_through_the_protocol():
    calls: set[str] = set()
    for module in ("training/trainer.py", "training/recovery.py"):
        for node in ast.walk(ast.parse((SRC / module).read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "worker"
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "self"
            ):
                calls.add(node.attr)
    assert {"rollout", "update", "save_optimizer_state"} <= calls  # the walk finds the calls
    assert calls <= set(MEMBERS), f"not in WorkerGroup: {sorted(calls - set(MEMBERS))}"
