"""`LazySplit`: a split's task list, computed on first access and memoised (used by the built-in envs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, overload

from vlrl.envs.base import Task
from vlrl.envs.config import SPLITS
from vlrl.errors import VlrlError

# make_task(config, split, index, used) -> task `index` of `split`; see LazySplit.
MakeTask = Callable[[Any, str, int, "set | None"], Task]


class LazySplit(Sequence[Task]):
    """The tasks of one split, computed on first access and memoised; indexable and iterable.

    `version_of(config, split)` is the split's version. Train tasks are random-access: `make_task(config, "train",
    index, None)`, so a 100k-task
    train split costs nothing to list. Held-out tasks are distinct, so they are built in order,
    each by `make_task(config, split, index, used)` with `used` the distinct keys of the tasks
    before it (which it extends).
    """

    def __init__(self, config: Any, split: str, version_of: Callable[[Any, str], str], make_task: MakeTask):
        if split not in SPLITS:
            raise VlrlError(f"unknown split '{split}'; use one of {', '.join(SPLITS)}")
        self.config = config.model_copy(deep=True)
        self.name = split
        self.count = getattr(config, split).count
        self.version = version_of(config, split)
        self._make_task = make_task
        self._tasks: dict[int, Task] = {}
        self._used: set = set()  # distinct keys of the held-out tasks built so far

    def __len__(self) -> int:
        return self.count

    @overload
    def __getitem__(self, index: int) -> Task: ...

    @overload
    def __getitem__(self, index: slice) -> list[Task]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(f"split {self.name} has {self.count} tasks; index {index} is out of range")
        if index not in self._tasks:
            if self.name == "train":
                self._tasks[index] = self._make_task(self.config, self.name, index, None)
            else:  # distinct tasks: built in order, each avoiding the ones before it
                for i in range(len(self._tasks), index + 1):
                    self._tasks[i] = self._make_task(self.config, self.name, i, self._used)
        return self._tasks[index]

    def __repr__(self) -> str:
        return f"Split({self.name!r}, count={self.count}, version={self.version!r})"
