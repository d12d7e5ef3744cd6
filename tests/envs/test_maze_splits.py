"""Splits: deterministic, versioned, disjoint by construction; adversarial variants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlrl.config import EnvConfig
from vlrl.envs import Task, build_split, make_env, overlapping_tasks, split_version
from vlrl.envs.maze.maze import check_perfect
from vlrl.envs.maze.render import render
from vlrl.envs.maze.splits import Split, maze_bucket, maze_for_task
from vlrl.errors import VlrlError


def small_config(**kw) -> EnvConfig:
    base = dict(
        sizes=[3, 5],
        train={"seed_start": 0, "count": 300},
        holdout={"seed_start": 1000, "count": 60},
        adversarial={"seed_start": 2000, "count": 48},
    )
    base.update(kw)
    return EnvConfig(**base)


def test_splits_are_deterministic_and_versioned():
    cfg = small_config()
    for split in ("train", "holdout", "adversarial"):
        a, b = build_split(cfg, split), build_split(cfg, split)
        assert len(a) == getattr(cfg, split).count
        assert list(a) == list(b)
        assert a.version == split_version(cfg, split)
    assert split_version(cfg, "holdout") != split_version(small_config(sizes=[3, 7]), "holdout")
    assert split_version(cfg, "holdout") != split_version(small_config(holdout={"seed_start": 1000, "count": 61}), "holdout")
    # seeds stay inside each split's own range
    assert [t.seed for t in build_split(cfg, "holdout")] == list(range(1000, 1060))


def test_sizes_cycle_and_split_sizes_override():
    cfg = small_config(holdout={"seed_start": 1000, "count": 6, "sizes": [7]})
    assert [t.params["size"] for t in build_split(cfg, "train")[:4]] == [3, 5, 3, 5]
    assert {t.params["size"] for t in build_split(cfg, "holdout")} == {7}


def test_buckets_make_splits_disjoint():
    cfg = small_config()
    train, holdout, adversarial = (build_split(cfg, s) for s in ("train", "holdout", "adversarial"))
    assert all(maze_bucket(maze_for_task(t)) < 14 for t in train)
    assert all(maze_bucket(maze_for_task(t)) == 14 for t in holdout)
    assert all(maze_bucket(maze_for_task(t)) == 15 for t in adversarial)
    assert overlapping_tasks(holdout, train) == []
    assert overlapping_tasks(adversarial, train) == []
    assert overlapping_tasks(adversarial, holdout) == []


@settings(max_examples=15, deadline=None)
@given(train_start=st.integers(0, 10**6), count=st.integers(1, 40), size=st.integers(3, 6))
def test_disjoint_for_any_seeds_and_sizes(train_start, count, size):
    # 3x3 mazes have few distinct layouts, so overlaps would show up if the rule were broken.
    cfg = EnvConfig(
        sizes=[size], train={"seed_start": train_start, "count": count},
        holdout={"seed_start": 2 * 10**6, "count": count}, adversarial={"seed_start": 3 * 10**6, "count": count},
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
    cfg = EnvConfig()  # 100k train tasks
    split = build_split(cfg, "train")
    assert isinstance(split, Split) and len(split) == 100_000
    last = split[-1]
    assert last.index == 99_999 and last.seed == 99_999 and split[99_999] is last
    assert len(split._tasks) == 1  # nothing else was generated
    assert [t.index for t in split[10:13]] == [10, 11, 12]
    with pytest.raises(IndexError):
        split[100_000]


def test_adversarial_variants_differ():
    cfg = small_config(adversarial={"seed_start": 2000, "count": 32},
                       adversarial_variants={"extra_sizes": [7]})
    tasks = list(build_split(cfg, "adversarial"))
    variants = {t.params["variant"] for t in tasks}
    assert variants == {"theme:dark", "theme:pastel", "theme:noise", "transform:mirror", "transform:rotate90",
                        "transform:rotate180", "transform:rotate270", "placement:off_corner"}
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
