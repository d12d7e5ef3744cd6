"""Deterministic, versioned task lists for the maze: train, holdout and adversarial.

Disjoint by construction. Every maze has a content hash (walls + start + goal, see
`Maze.content_hash`); its *bucket* is that hash mod 16. A split only keeps mazes of its own
buckets: train 0-13, holdout 14, adversarial 15 (for adversarial tasks, the bucket of the maze
as the agent sees it, after any mirror/rotation). Two tasks of different splits therefore never
show the same maze, whatever the seeds and sizes. `overlapping_tasks` re-checks this by content.

Task `index` of a split has seed `seed_start + index`, so seeds stay inside the split's range
(which `EnvConfig` checks are disjoint). The maze of a task is generated from (size, seed,
attempt); attempt 0, 1, 2, ... are tried until the maze falls in the split's bucket (about 1.1
tries for train, 16 for holdout/adversarial) and the attempt is stored in the task's params, so
resetting a task never searches again. Sizes cycle with the index. Train tasks are computed on
demand (`Split` is a lazy, memoising sequence), so a 100k-task train split costs nothing to list.

Adversarial tasks cycle through variants: each colour theme, each transform, and random
placement away from the corners; their sizes are the split's sizes plus `extra_sizes`.

Every task's params carry the maze `layout` (`env.layout`: cells or blocks); the content hash of
a block maze includes its layout, the bucket rule is the same for both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, overload

from vlrl.config import EnvConfig
from vlrl.envs.base import Task, env_class, overlapping_tasks  # noqa: F401  (re-exported: content-hash overlap check)
from vlrl.envs.maze.maze import GENERATOR_VERSION, MAX_SIZE, MIN_SIZE, Maze, check_size, generate_maze
from vlrl.envs.maze.render import THEMES
from vlrl.errors import VlrlError

SPLIT_RULE = "bucket16-v1"
BUCKETS = 16
SPLIT_BUCKETS = {"train": frozenset(range(14)), "holdout": frozenset({14}), "adversarial": frozenset({15})}
MAX_ATTEMPTS = 4096
MAZE_ENVS = ("maze", "maze_plan")


def maze_bucket(maze: Maze) -> int:
    """The split bucket (0-15) of a maze, from its content hash."""
    return int(maze.content_hash()[:16], 16) % BUCKETS


def _split_sizes(config: EnvConfig, split: str) -> list[int]:
    sizes = list(getattr(config, split).sizes or config.sizes)
    if split == "adversarial":
        sizes += [n for n in config.adversarial_variants.extra_sizes if n not in sizes]
    for n in sizes:
        if not isinstance(n, int) or not MIN_SIZE <= n <= MAX_SIZE:
            raise VlrlError(f"env.{split}: maze size {n!r} is out of range; sizes must be between {MIN_SIZE} and {MAX_SIZE}")
        try:
            check_size(n, config.layout)
        except VlrlError as exc:
            raise VlrlError(f"env.{split}: {exc}") from None
    if not sizes:
        raise VlrlError(f"env.{split}: no maze sizes; set env.sizes or env.{split}.sizes")
    return sizes


def _adversarial_variants(config: EnvConfig) -> list[dict[str, str]]:
    adv = config.adversarial_variants
    for theme in adv.themes:
        if theme not in THEMES:
            raise VlrlError(f"env.adversarial_variants.themes: unknown theme {theme!r}; known: {', '.join(THEMES)}")
    variants = [{"variant": f"theme:{t}", "theme": t} for t in adv.themes]
    variants += [{"variant": f"transform:{t}", "transform": t} for t in adv.transforms]
    variants.append({"variant": "placement:off_corner", "placement": "off_corner"})
    return variants


def _params(config: EnvConfig, split: str, index: int) -> dict[str, Any]:
    """Task params before the attempt search: layout, size, placement, theme, transform."""
    sizes = _split_sizes(config, split)
    params: dict[str, Any] = {
        "layout": config.layout,
        "size": sizes[index % len(sizes)],
        "placement": config.placement,
        "min_distance": config.min_distance,
        "theme": "default",
        "transform": "none",
    }
    if split == "adversarial":
        variants = _adversarial_variants(config)
        # Size advances once per full cycle of variants, so every (variant, size) pair occurs.
        params["size"] = sizes[(index // len(variants)) % len(sizes)]
        params.update(variants[index % len(variants)])
    return params


def _maze_from_params(seed: int, params: dict[str, Any], attempt: int) -> Maze | None:
    return generate_maze(
        params["size"], seed, attempt=attempt, placement=params["placement"],
        min_distance=params["min_distance"], transform=params["transform"],
        layout=params.get("layout", "cells"),  # tasks from before layouts existed are cell mazes
    )


def make_task(config: EnvConfig, split: str, index: int) -> Task:
    """Task `index` of a split: the first attempt whose maze lands in the split's bucket."""
    params = _params(config, split, index)
    seed = getattr(config, split).seed_start + index
    for attempt in range(MAX_ATTEMPTS):
        maze = _maze_from_params(seed, params, attempt)
        if maze is not None and maze_bucket(maze) in SPLIT_BUCKETS[split]:
            return Task(config.name, split, index, seed, {**params, "attempt": attempt})
    raise VlrlError(
        f"env.{split}: no {params['size']}x{params['size']} {params['layout']} maze with placement {params['placement']} and "
        f"min_distance {params['min_distance']} found for seed {seed}; lower env.min_distance"
    )


@lru_cache(maxsize=4096)
def _is_maze_variant(env_name: str) -> bool:
    """A registered env that plays maze tasks (e.g. a subclass with another reward)."""
    try:
        return bool(getattr(env_class(env_name), "maze_tasks", False))
    except VlrlError:
        return False


def maze_for_task(task: Task) -> Maze:
    """The maze of a task (memoised: the G episodes of a group share it)."""
    if task.env not in MAZE_ENVS and not _is_maze_variant(task.env):
        raise VlrlError(f"task {task.task_id} is for env '{task.env}', not a maze")
    needed = {"size", "placement", "min_distance", "theme", "transform", "attempt"}
    missing = needed - set(task.params)
    if missing:
        raise VlrlError(f"task {task.task_id} lacks maze params {sorted(missing)}")
    if task.params["theme"] not in THEMES:
        raise VlrlError(f"task {task.task_id}: unknown theme {task.params['theme']!r}; known: {', '.join(THEMES)}")
    maze = _maze_from_params(task.seed, task.params, task.params["attempt"])
    if maze is None:
        raise VlrlError(f"task {task.task_id}: its params give no valid start/goal placement")
    return maze


def maze_content_hash(task: Task) -> str:
    """Content hash of the maze a task shows (layout, walls, start, goal; not theme or seed)."""
    return maze_for_task(task).content_hash()


def train_overlap(tasks: Sequence[Task]) -> list[Task]:
    """Tasks whose maze could be a training maze: those whose content falls in a train bucket.

    Training mazes are exactly the train-bucket mazes, so this finds every overlap with the
    training split of any size without listing it (a maze in the holdout or adversarial bucket
    can never be a training maze).
    """
    return [t for t in tasks if maze_bucket(maze_for_task(t)) in SPLIT_BUCKETS["train"]]


def maze_split_version(config: EnvConfig, split: str) -> str:
    """12-hex-digit hash of everything that decides a split's tasks."""
    spec: dict[str, Any] = {
        "rule": SPLIT_RULE,
        "generator": GENERATOR_VERSION,
        "split": split,
        "seed_start": getattr(config, split).seed_start,
        "count": getattr(config, split).count,
        "layout": config.layout,
        "sizes": _split_sizes(config, split),
        "placement": config.placement,
        "min_distance": config.min_distance,
    }
    if split == "adversarial":
        spec["variants"] = _adversarial_variants(config)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


class Split(Sequence[Task]):
    """The tasks of one split, computed on first access and memoised; indexable and iterable."""

    def __init__(self, config: EnvConfig, split: str):
        if split not in SPLIT_BUCKETS:
            raise VlrlError(f"unknown split '{split}'; use one of {', '.join(SPLIT_BUCKETS)}")
        self.config = config.model_copy(deep=True)
        self.name = split
        self.count = getattr(config, split).count
        self.version = maze_split_version(config, split)
        self._tasks: dict[int, Task] = {}

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
            self._tasks[index] = make_task(self.config, self.name, index)
        return self._tasks[index]

    def __repr__(self) -> str:
        return f"Split({self.name!r}, count={self.count}, version={self.version!r})"


def build_maze_split(config: EnvConfig, split: str) -> Split:
    """The split's tasks as a lazy `Split` sequence."""
    return Split(config, split)


def adhoc_task(
    size: int, seed: int, *, env: str = "maze", placement: str = "corners", min_distance: int = 2,
    theme: str = "default", transform: str = "none", layout: str = "cells",
) -> Task:
    """A task outside any split (split name `adhoc`), e.g. to render or play one maze by seed."""
    check_size(size, layout)
    params: dict[str, Any] = {
        "layout": layout, "size": size, "placement": placement, "min_distance": min_distance,
        "theme": theme, "transform": transform,
    }
    for attempt in range(MAX_ATTEMPTS):
        if _maze_from_params(seed, params, attempt) is not None:
            return Task(env, "adhoc", 0, seed, {**params, "attempt": attempt})
    raise VlrlError(f"no {size}x{size} {layout} maze with placement {placement} and min_distance {min_distance}; lower min_distance")
