"""Deterministic, versioned task lists for the maze: train, holdout and adversarial.

Disjoint by wall layout, by construction. A maze's *layout* is its walls alone, without start
and goal; its layout key is `Maze.canonical_layout_hash`, the smallest hash over the layout's 8
mirror/rotation images, so a mirrored or rotated copy of a layout has the same key. Each layout
key belongs to exactly one split:

- sizes with many layouts (more than 3 x 3 rooms: a 4 x 4 cell maze already has 100,352): the
  key's *bucket* is key mod 16; train owns buckets 0-13, holdout 14, adversarial 15;
- sizes with few layouts (3 x 3 cells: 192 layouts in 28 mirror/rotation classes; 7 x 7 blocks,
  which are 3 x 3 rooms, the same): every layout is enumerated and the classes, sorted by key,
  are dealt out: holdout takes classes until it has at least 1/16 of the layouts, adversarial
  the next ones likewise, train keeps the rest (`reserved_layouts`; 3 x 3 cells: holdout 12,
  adversarial 12, train 168 layouts). 5 x 5 blocks (2 x 2 rooms: 4 layouts, all rotations of one)
  cannot be split: all go to train, and a holdout or adversarial split of that size is refused.

So no held-out task shows a training wall layout, nor a mirrored or rotated one, whatever the
seeds, placements and themes; start/goal placement is drawn within the split. Adversarial
transforms (mirror, rotations) keep the layout key, so an adversarial maze stays in its split.
`train_overlap` re-checks any task list by layout without listing the training split.

Task `index` of a split has seed `seed_start + index`, so seeds stay inside the split's range
(which the env config checks are disjoint). The maze of a task is generated from (size, seed,
attempt); attempt 0, 1, 2, ... are tried until the maze's layout belongs to the split (about 1.1
tries for train, 16 for holdout/adversarial) and the attempt is stored in the task's params, so
resetting a task never searches again. Holdout and adversarial tasks are also distinct: an
attempt that repeats an earlier task of the split (same walls, start and goal; for adversarial
tasks also the same theme) is skipped, so these splits are built in order. Train tasks may repeat
and are computed on demand (`Split` is a lazy, memoising sequence), so a 100k-task train split
costs nothing to list. Sizes cycle with the index.

Adversarial tasks cycle through variants: each colour theme, each transform, and random
placement away from the corners; their sizes are the split's sizes plus `extra_sizes`.

Every task's params carry the maze `layout` (`env.layout`: cells or blocks); the layout key of a
block maze includes its layout, the split rule is the same for both.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Sequence
from functools import cache, lru_cache
from typing import Any

from vlrl.envs.base import Task, env_class, overlapping_tasks  # noqa: F401  (re-exported: content-hash overlap check)
from vlrl.envs.lazy_split import LazySplit
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.envs.maze.generate import _distances_flat, expand_to_blocks, generate_maze
from vlrl.envs.maze.maze import (
    GENERATOR_VERSION,
    MAX_SIZE,
    MIN_SIZE,
    OPPOSITE,
    E,
    Maze,
    S,
    _corner_span,
    canonical_walls_hash,
    check_size,
)
from vlrl.envs.maze.render import THEMES
from vlrl.errors import VlrlError

SPLIT_RULE = "layout16-v2"  # v1 (bucket16-v1) split by the hash of walls + start + goal
BUCKETS = 16
SPLIT_BUCKETS = {"train": frozenset(range(14)), "holdout": frozenset({14}), "adversarial": frozenset({15})}
MAX_ENUMERATED_ROOMS = 3  # up to 3 x 3 rooms (192 layouts) the layouts are enumerated and dealt out
RESERVED_SHARE = 1 / BUCKETS  # of an enumerated size's layouts, at least this share each for holdout and adversarial
MAX_ATTEMPTS = 4096
MAZE_ENVS = ("maze", "maze_plan")


def maze_bucket(maze: Maze) -> int:
    """The split bucket (0-15) of a maze, from the key of its wall layout (sizes above 3 x 3 rooms)."""
    return int(maze.canonical_layout_hash()[:16], 16) % BUCKETS


def _rooms(layout: str, size: int) -> int:
    return (size - 1) // 2 if layout == "blocks" else size


def _spanning_trees(k: int) -> list[tuple[int, ...]]:
    """Open-side masks of every spanning tree of the k x k grid (every perfect k x k cell maze)."""
    edges = [(r * k + c, r * k + c + 1, E) for r in range(k) for c in range(k - 1)]
    edges += [(r * k + c, (r + 1) * k + c, S) for r in range(k - 1) for c in range(k)]
    trees = []
    for chosen in itertools.combinations(edges, k * k - 1):
        root = list(range(k * k))

        def find(x: int) -> int:
            while root[x] != x:  # noqa: B023 (called within this iteration only)
                x = root[x]  # noqa: B023
            return x

        masks = [0] * (k * k)
        for a, b, side in chosen:
            ra, rb = find(a), find(b)
            if ra == rb:
                break  # a cycle: k*k - 1 edges with a cycle cannot span the grid
            root[ra] = rb
            masks[a] |= side
            masks[b] |= OPPOSITE[side]
        else:
            trees.append(tuple(masks))
    return trees


@cache
def reserved_layouts(layout: str, size: int) -> dict[str, str] | None:
    """For a size with few layouts, {layout key: split} over all of them; None for larger sizes.

    Classes (a layout with its mirror/rotation images, one key) sorted by key are dealt out:
    holdout takes classes until it holds >= RESERVED_SHARE of the layouts, adversarial the same,
    train keeps the rest. With fewer than three classes everything stays in train.
    """
    k = _rooms(layout, size)
    if k > MAX_ENUMERATED_ROOMS:
        return None
    class_sizes: dict[str, int] = {}
    for tree in _spanning_trees(k):
        masks = expand_to_blocks(k, tree) if layout == "blocks" else tree
        key = canonical_walls_hash(layout, size, masks)
        class_sizes[key] = class_sizes.get(key, 0) + 1
    keys = sorted(class_sizes)
    owner = dict.fromkeys(keys, "train")
    if len(keys) >= 3:
        need = math.ceil(RESERVED_SHARE * sum(class_sizes.values()))
        order = iter(keys)
        for split in ("holdout", "adversarial"):
            held = 0
            while held < need:
                key = next(order)
                owner[key] = split
                held += class_sizes[key]
    return owner


def layout_split(maze: Maze) -> str:
    """The split that owns the maze's wall layout: train, holdout or adversarial."""
    key = maze.canonical_layout_hash()
    table = reserved_layouts(maze.layout, maze.size)
    if table is not None:
        return table[key]
    bucket = int(key[:16], 16) % BUCKETS
    return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


@cache
def split_layouts(layout: str, size: int, split: str) -> tuple[tuple[int, ...], ...] | None:
    """The masks of every wall layout of this size the split owns; None for sizes too large to enumerate."""
    table = reserved_layouts(layout, size)
    if table is None:
        return None
    k = _rooms(layout, size)
    every = (expand_to_blocks(k, tree) if layout == "blocks" else tree for tree in _spanning_trees(k))
    return tuple(m for m in every if table[canonical_walls_hash(layout, size, m)] == split)


def distinct_placements(maze: Maze, placement: str, min_distance: int) -> int:
    """How many (start, goal) pairs the placement rule allows in this maze's walls."""
    if placement == "corners":
        return 4
    n = maze.size
    lo, hi = _corner_span(n, maze.layout)
    corners = {lo * n + lo, lo * n + hi, hi * n + lo, hi * n + hi}
    allowed = {i for i in range(n * n) if maze.is_free(divmod(i, n)) and (placement == "random" or i not in corners)}
    return sum(
        1 for a in allowed for b, d in enumerate(_distances_flat(n, maze.open, a)) if b in allowed and d >= min_distance
    )


def split_capacity(layout: str, size: int, split: str, placement: str, min_distance: int) -> int | None:
    """Distinct (walls, start, goal) tasks of one size the split can hold; None when too many to count."""
    layouts = split_layouts(layout, size, split)
    if layouts is None:
        return None
    return sum(
        distinct_placements(Maze(size, m, (0, 0), (0, 0), layout=layout), placement, min_distance) for m in layouts
    )


def _split_sizes(config: MazeEnvConfig, split: str) -> list[int]:
    sizes = list(getattr(config, split).sizes or config.sizes)
    if split == "adversarial":
        sizes += [n for n in config.adversarial_variants.extra_sizes if n not in sizes]
    for n in sizes:
        if not isinstance(n, int) or not MIN_SIZE <= n <= MAX_SIZE:
            raise VlrlError(
                f"env.{split}: maze size {n!r} is out of range; sizes must be between {MIN_SIZE} and {MAX_SIZE}"
            )
        try:
            check_size(n, config.layout)
        except VlrlError as exc:
            raise VlrlError(f"env.{split}: {exc}") from None
    if not sizes:
        raise VlrlError(f"env.{split}: no maze sizes; set env.sizes or env.{split}.sizes")
    return sizes


def _adversarial_variants(config: MazeEnvConfig) -> list[dict[str, str]]:
    adv = config.adversarial_variants
    for theme in adv.themes:
        if theme not in THEMES:
            raise VlrlError(f"env.adversarial_variants.themes: unknown theme {theme!r}; known: {', '.join(THEMES)}")
    variants = [{"variant": f"theme:{t}", "theme": t} for t in adv.themes]
    variants += [{"variant": f"transform:{t}", "transform": t} for t in adv.transforms]
    variants.append({"variant": "placement:off_corner", "placement": "off_corner"})
    return variants


def _params(config: MazeEnvConfig, split: str, index: int) -> dict[str, Any]:
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


def _capacity_note(config: MazeEnvConfig, split: str, size: int) -> str:
    layouts = split_layouts(config.layout, size, split)
    if layouts is None:
        return "a large size: raise MAX_ATTEMPTS or check the placement rule"
    capacity = split_capacity(config.layout, size, split, config.placement, config.min_distance)
    return f"{len(layouts)} {size}x{size} layouts, {capacity} distinct tasks with placement {config.placement}"


def _maze_from_params(seed: int, params: dict[str, Any], attempt: int) -> Maze | None:
    return generate_maze(
        params["size"],
        seed,
        attempt=attempt,
        placement=params["placement"],
        min_distance=params["min_distance"],
        transform=params["transform"],
        layout=params.get("layout", "cells"),  # tasks from before layouts existed are cell mazes
    )


def _distinct_key(maze: Maze, params: dict[str, Any]) -> tuple[str, str]:
    """What makes two held-out tasks the same task: the maze as shown (walls, start, goal) and its theme."""
    return maze.content_hash(), params["theme"]


def make_task(config: MazeEnvConfig, split: str, index: int, used: set[tuple[str, str]] | None = None) -> Task:
    """Task `index` of a split: the first attempt whose maze's layout the split owns.

    With `used` (the distinct keys of the split's earlier tasks), an attempt that repeats one of
    them is skipped and the new task's key is added.
    """
    params = _params(config, split, index)
    seed = getattr(config, split).seed_start + index
    size, layout = params["size"], params["layout"]
    if split_layouts(layout, size, split) == ():
        raise VlrlError(
            f"env.{split}: {size}x{size} {layout} mazes have too few wall layouts to hold any out "
            f"(all {len(_spanning_trees(_rooms(layout, size)))} are mirror/rotation images of one another and "
            f"belong to train); use larger sizes for env.{split}.sizes"
        )
    placed = 0
    for attempt in range(MAX_ATTEMPTS):
        maze = _maze_from_params(seed, params, attempt)
        if maze is None or layout_split(maze) != split:
            continue
        placed += 1
        if used is not None:
            key = _distinct_key(maze, params)
            if key in used:
                continue
            used.add(key)
        return Task(config.name, split, index, seed, {**params, "attempt": attempt})
    if placed and used is not None:
        raise VlrlError(
            f"env.{split}: task {index} found no {size}x{size} {layout} maze unlike the split's earlier tasks in "
            f"{MAX_ATTEMPTS} draws: the split's wall layouts hold too few distinct tasks for env.{split}.count "
            f"{getattr(config, split).count} ({_capacity_note(config, split, size)}); lower env.{split}.count"
        )
    raise VlrlError(
        f"env.{split}: no {size}x{size} {layout} maze with placement {params['placement']} and "
        f"min_distance {params['min_distance']} found for seed {seed}; lower env.min_distance"
    )


@lru_cache(maxsize=4096)
def _is_maze_variant(env_name: str) -> bool:
    """A registered env that plays maze tasks (e.g. a subclass with another reward)."""
    from vlrl.envs.maze.env import MazeEpisode  # the env module imports this one

    try:
        return issubclass(env_class(env_name), MazeEpisode)
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
    """Tasks whose wall layout could be a training layout: those whose layout train owns.

    Training mazes only use train-owned layouts, so this finds every task that shares walls
    (or mirrored/rotated walls) with the training split of any size without listing it.
    """
    return [t for t in tasks if layout_split(maze_for_task(t)) == "train"]


def maze_split_version(config: MazeEnvConfig, split: str) -> str:
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


class Split(LazySplit):
    """The tasks of one split (see `LazySplit`): train on demand, held-out ones distinct and in order."""

    def __init__(self, config, split: str):
        super().__init__(config, split, maze_split_version, make_task)


def build_maze_split(config: MazeEnvConfig, split: str) -> Split:
    """The split's tasks as a lazy `Split` sequence."""
    return Split(config, split)


def adhoc_task(
    size: int,
    seed: int,
    *,
    env: str = "maze",
    placement: str = "corners",
    min_distance: int = 2,
    theme: str = "default",
    transform: str = "none",
    layout: str = "cells",
) -> Task:
    """A task outside any split (split name `adhoc`), e.g. to render or play one maze by seed."""
    check_size(size, layout)
    params: dict[str, Any] = {
        "layout": layout,
        "size": size,
        "placement": placement,
        "min_distance": min_distance,
        "theme": theme,
        "transform": transform,
    }
    for attempt in range(MAX_ATTEMPTS):
        if _maze_from_params(seed, params, attempt) is not None:
            return Task(env, "adhoc", 0, seed, {**params, "attempt": attempt})
    raise VlrlError(
        f"no {size}x{size} {layout} maze with placement {placement} and min_distance {min_distance}; lower min_distance"
    )
