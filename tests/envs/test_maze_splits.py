"""Splits: deterministic, versioned, disjoint by construction; adversarial variants."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlrl.config import load_config
from vlrl.envs import Task, build_split, make_env, overlapping_tasks, split_version
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.envs.maze.maze import check_perfect
from vlrl.envs.maze.render import render
from vlrl.envs.maze.splits import (
    Split,
    layout_split,
    maze_bucket,
    maze_for_task,
    reserved_layouts,
    split_capacity,
    split_layouts,
)
from vlrl.errors import VlrlError


def small_config(**kw) -> MazeEnvConfig:
    base = dict(
        sizes=[3, 5],
        train={"seed_start": 0, "count": 300},
        holdout={"seed_start": 1000, "count": 60},
        adversarial={"seed_start": 2000, "count": 48},
    )
    base.update(kw)
    return MazeEnvConfig(**base)


def test_splits_are_deterministic_and_versioned():
    cfg = small_config()
    for split in ("train", "holdout", "adversarial"):
        a, b = build_split(cfg, split), build_split(cfg, split)
        assert len(a) == getattr(cfg, split).count
        assert list(a) == list(b)
        assert a.version == split_version(cfg, split)
    assert split_version(cfg, "holdout") != split_version(small_config(sizes=[3, 7]), "holdout")
    assert split_version(cfg, "holdout") != split_version(
        small_config(holdout={"seed_start": 1000, "count": 61}), "holdout"
    )
    # seeds stay inside each split's own range
    assert [t.seed for t in build_split(cfg, "holdout")] == list(range(1000, 1060))


def test_sizes_cycle_and_split_sizes_override():
    cfg = small_config(holdout={"seed_start": 1000, "count": 6, "sizes": [7]})
    assert [t.params["size"] for t in build_split(cfg, "train")[:4]] == [3, 5, 3, 5]
    assert {t.params["size"] for t in build_split(cfg, "holdout")} == {7}


def test_layouts_make_splits_disjoint():
    cfg = small_config()
    train, holdout, adversarial = (build_split(cfg, s) for s in ("train", "holdout", "adversarial"))
    for name, split in (("train", train), ("holdout", holdout), ("adversarial", adversarial)):
        assert {layout_split(maze_for_task(t)) for t in split} == {name}
    # 5x5 is above the enumerated sizes: the split is the bucket of the layout key
    assert {maze_bucket(maze_for_task(t)) for t in holdout if t.params["size"] == 5} == {14}
    assert overlapping_tasks(holdout, train) == []
    assert overlapping_tasks(adversarial, train) == []
    assert overlapping_tasks(adversarial, holdout) == []
    layouts = {
        s: {maze_for_task(t).canonical_layout_hash() for t in split}
        for s, split in (("train", train), ("holdout", holdout), ("adversarial", adversarial))
    }
    assert not layouts["train"] & layouts["holdout"] and not layouts["train"] & layouts["adversarial"]
    assert not layouts["holdout"] & layouts["adversarial"]


def test_held_out_tasks_are_distinct():
    cfg = small_config(sizes=[3], placement="corners", holdout={"seed_start": 1000, "count": 64})
    holdout = build_split(cfg, "holdout")
    assert len({maze_for_task(t).content_hash() for t in holdout}) == 64  # all 16 layouts x 4 corner pairs
    too_many = small_config(sizes=[3], placement="corners", holdout={"seed_start": 1000, "count": 65})
    with pytest.raises(VlrlError, match="16 3x3 layouts, 64 distinct tasks"):
        build_split(too_many, "holdout")[64]


def test_reserved_share_of_3x3_layouts_is_as_documented():
    # docs/maze.md: 192 layouts in 28 mirror/rotation classes; holdout 16, adversarial 12, train 164
    table = reserved_layouts("cells", 3)
    assert len(table) == 28
    counts = {s: len(split_layouts("cells", 3, s)) for s in ("train", "holdout", "adversarial")}
    assert counts == {"train": 164, "holdout": 16, "adversarial": 12} and sum(counts.values()) == 192
    assert min(counts["holdout"], counts["adversarial"]) >= 192 / 16
    # the demo (random placement, min_distance 2) can draw its 400 distinct holdout tasks from 896
    assert split_capacity("cells", 3, "holdout", "random", 2) == 896
    assert (
        split_capacity("cells", 3, "train", "random", 2) + 896 + split_capacity("cells", 3, "adversarial", "random", 2)
        == 192 * 56
    )
    assert reserved_layouts("cells", 4) is None  # 100,352 layouts: bucketed by hash


def test_mirrored_or_rotated_layouts_stay_in_their_split():
    cfg = small_config(sizes=[3, 4, 5], holdout={"seed_start": 1000, "count": 30})
    for task in build_split(cfg, "holdout"):
        maze = maze_for_task(task)
        for transform in ("mirror", "rotate90", "rotate180", "rotate270"):
            image = maze.transformed(transform)
            assert image.canonical_layout_hash() == maze.canonical_layout_hash()
            assert layout_split(image) == "holdout"


def test_too_small_block_size_cannot_be_held_out():
    cfg = MazeEnvConfig(layout="blocks", sizes=[5], holdout={"seed_start": 10**7, "count": 4})
    assert {layout_split(maze_for_task(t)) for t in build_split(cfg, "train")[:20]} == {"train"}
    with pytest.raises(VlrlError, match="too few wall layouts to hold any out"):
        build_split(cfg, "holdout")[0]


@settings(max_examples=15, deadline=None)
@given(train_start=st.integers(0, 10**6), count=st.integers(1, 40), size=st.integers(3, 6))
def test_disjoint_for_any_seeds_and_sizes(train_start, count, size):
    # 3x3 mazes have few distinct layouts, so overlaps would show up if the rule were broken.
    cfg = MazeEnvConfig(
        sizes=[size],
        train={"seed_start": train_start, "count": count},
        holdout={"seed_start": 2 * 10**6, "count": count},
        adversarial={"seed_start": 3 * 10**6, "count": count},
    )
    train = build_split(cfg, "train")
    for other in ("holdout", "adversarial"):
        assert overlapping_tasks(build_split(cfg, other), train) == []


def test_overlapping_tasks_catches_a_planted_overlap():
    cfg = small_config()
    train, holdout = build_split(cfg, "train"), list(build_split(cfg, "holdout"))
    planted = Task("maze", "holdout", 999, train[7].seed, dict(train[7].params))
    pairs = overlapping_tasks(holdout + [planted], train)
    assert pairs and all(a == planted for a, _ in pairs) and train[7] in [b for _, b in pairs]
    # same maze, different theme: still the same content
    themed = Task("maze", "holdout", 998, train[7].seed, {**train[7].params, "theme": "dark"})
    assert overlapping_tasks([themed], [train[7]]) == [(themed, train[7])]


def test_train_split_is_lazy_and_indexable():
    cfg = MazeEnvConfig()  # 100k train tasks
    split = build_split(cfg, "train")
    assert isinstance(split, Split) and len(split) == 100_000
    last = split[-1]
    assert last.index == 99_999 and last.seed == 99_999 and split[99_999] is last
    assert len(split._tasks) == 1  # nothing else was generated
    assert [t.index for t in split[10:13]] == [10, 11, 12]
    with pytest.raises(IndexError):
        split[100_000]


def test_adversarial_variants_differ():
    cfg = small_config(adversarial={"seed_start": 2000, "count": 32}, adversarial_variants={"extra_sizes": [7]})
    tasks = list(build_split(cfg, "adversarial"))
    variants = {t.params["variant"] for t in tasks}
    assert variants == {
        "theme:dark",
        "theme:pastel",
        "theme:noise",
        "transform:mirror",
        "transform:rotate90",
        "transform:rotate180",
        "transform:rotate270",
        "placement:off_corner",
    }
    assert {t.params["size"] for t in tasks} == {3, 5, 7}
    env = make_env(cfg)
    for task in tasks:
        maze = maze_for_task(task)
        check_perfect(maze)
        obs = env.reset(task)
        default_look = render(maze, maze.start, cfg.cell_px, "default")
        if task.params["variant"].startswith("theme:"):
            assert obs.images[0].tobytes() != default_look.tobytes()
        if task.params["variant"].startswith("transform:"):
            assert maze.transform == task.params["transform"]
        if task.params["variant"] == "placement:off_corner":
            assert maze.start not in maze.corners() and maze.goal not in maze.corners()


def test_bad_split_settings():
    with pytest.raises(VlrlError, match="theme"):
        list(build_split(small_config(adversarial_variants={"themes": ["neon"]}), "adversarial"))
    with pytest.raises(VlrlError, match="out of range"):
        build_split(small_config(holdout={"seed_start": 1000, "count": 5, "sizes": [99]}), "holdout")
    with pytest.raises(VlrlError, match="min_distance"):
        build_split(small_config(placement="random", min_distance=500), "holdout")[0]


SHIPPED_CONFIGS = [  # the maze configs (configs/gui-*.yaml: tests/envs/gui)
    p
    for p in sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
    if load_config(p).env.name in ("maze", "maze_plan")
]


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_hold_out_whole_wall_layouts(path):
    # Every held-out task as configured, and 3000 training tasks: no wall layout (up to mirror and
    # rotation) is shared, and the held-out tasks are distinct.
    env = load_config(path).env
    train = build_split(env, "train")
    train_layouts = {maze_for_task(train[i]).canonical_layout_hash() for i in range(min(3000, len(train)))}
    held: dict[str, set[str]] = {}
    for name in ("holdout", "adversarial"):
        tasks = list(build_split(env, name))
        assert len(tasks) == getattr(env, name).count
        mazes = [maze_for_task(t) for t in tasks]
        assert len({(m.content_hash(), t.params["theme"]) for m, t in zip(mazes, tasks)}) == len(tasks)
        held[name] = {m.canonical_layout_hash() for m in mazes}
        assert not held[name] & train_layouts, f"{path.name}: {name} shares wall layouts with train"
    assert not held["holdout"] & held["adversarial"]
    if (
        env.sizes == [3] and env.layout == "cells"
    ):  # the 3x3 configs: the sample covers train's 164 layouts (24 classes)
        assert len(train_layouts) == 24
        assert len({maze_for_task(train[i]).layout_hash() for i in range(3000)}) == 164
