"""`WorkerGroup`: every call the trainer makes on its workers, in one place.

`GRPOTrainer` drives either one in-process `vlrl.training.worker.Worker` (runtime.backend=local,
W = 1) or a `vlrl.runtime.worker_group.RayWorkerGroup` of W workers on Ray. Both satisfy this
protocol structurally (neither inherits it; `tests/runtime/test_worker_api.py` checks both
against it), so the loop is written once, against this interface.

A group behaves like one worker: rollouts and evaluations come back in task order, an update
equals one worker's update on the same episodes, state comes back whole (gathered from shards),
and every call reaches every worker (they share collectives, so none may skip one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import torch

from vlrl.envs.base import Task
from vlrl.eval.evaluate import EvalResult
from vlrl.rollout.engine import SamplingParams
from vlrl.rollout.episodes import Episode, RolloutStats
from vlrl.runtime.update_plan import UpdateStats


class WorkerGroup(Protocol):
    """The policy and its rollout engines, on one device or on W, driven as one."""

    # -- one GRPO step --------------------------------------------------------------------------
    def sampling_params(self, greedy: bool = False, seed: int | None = None) -> SamplingParams:
        """The run's sampling (`rollout.*`), or greedy decoding, seeded with `seed`."""

    def rollout(
        self, tasks: list[Task], group_size: int, params: SamplingParams, stats: RolloutStats | None = None
    ) -> list[Episode]:
        """`group_size` episodes per task, in task order; adds generation and env costs to `stats`."""

    def update(self, episodes: list[Episode], advantages: list[float], seed: int) -> UpdateStats:
        """One GRPO update (old/reference log-probs, loss, optimizer steps) on these episodes."""

    def sync_adapter(self, version: int) -> float:
        """Every engine serves the adapter just trained, as `version`; the seconds it took."""

    def sync_info(self) -> dict[str, float]:
        """How adapters reach the engines, as step-record values (`sync/transport_*`)."""

    def evaluate(self, tasks: list[Task], greedy: bool, label: str) -> EvalResult:
        """One episode per task with the current adapter."""

    def resources(self) -> dict[str, float]:
        """Host and GPU readings of every worker, as `resource/<rank>/...` keys."""

    # -- state: checkpoints, guards, the final adapter ------------------------------------------
    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The full LoRA weights on CPU."""

    def load_adapter_state(self, adapter: dict[str, torch.Tensor]) -> None:
        """Put full LoRA weights (from any number of workers) into the policy."""

    def training_state(self) -> dict[str, Any]:
        """A copy of optimizer and LR-scheduler state in memory (a guard's `skip` restores it)."""

    def load_training_state(self, adapter: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        """Restore adapter, optimizer and scheduler from `adapter_state` + `training_state`."""

    def save_optimizer_state(self, path: str) -> None:
        """Write optimizer and scheduler state under `path` (one DCP shard per worker)."""

    def load_optimizer_state(self, path: str) -> None:
        """Read optimizer and scheduler state written by any number of workers."""

    def rng_states(self) -> list[dict[str, Any]]:
        """Each worker's random states, by rank."""

    def load_rng_states(self, states: list[dict[str, Any]]) -> None:
        """Restore each rank's random states (ranks the list does not reach keep theirs)."""

    def set_lr_scale(self, scale: float) -> None:
        """Learning rate = train.lr x scale x the schedule from the next optimizer step on."""

    def base_fingerprint(self) -> str:
        """The fingerprint of the base weights the policy trains on."""

    def save_adapter(self, out_dir: str | os.PathLike) -> Path:
        """Write the adapter directory (with its base fingerprint); returns it."""

    def close(self) -> None:
        """Release engines, process groups and (on Ray) the actors and their placement group."""
