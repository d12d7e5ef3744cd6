"""Deterministic task sampling over a split, with a state that checkpoints can save and restore."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vlrl.envs.base import Task
from vlrl.errors import VlrlError


class TaskSampler:
    """Walks a split in a seeded random order, epoch after epoch.

    The order of epoch e is a permutation drawn from (seed, e), so the sampler's whole state is
    two integers: where it is in which epoch.
    """

    def __init__(self, split: Sequence[Task], seed: int):
        self.split = split
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.split))

    def next(self, count: int) -> list[Task]:
        """The next `count` tasks, crossing into a new epoch when the split runs out."""
        tasks: list[Task] = []
        while len(tasks) < count:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            tasks.append(self.split[int(self._order[self.position])])
            self.position += 1
        return tasks

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler is (JSON): seed, epoch, position in the epoch, and the split's size."""
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "split_size": len(self.split)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state_dict` was taken; the split must be the same size (else the order differs)."""
        size = state.get("split_size", len(self.split))
        if size != len(self.split):
            raise VlrlError(f"the task sampler was saved over a split of {size} tasks, this one has {len(self.split)}")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)
