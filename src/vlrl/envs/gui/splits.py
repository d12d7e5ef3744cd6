"""Deterministic, versioned task lists for the gui env: train, holdout and adversarial.

Disjoint by app layout, by construction (split rule `layout16-v1`): an app's layout is its size,
title and every widget's kind, label and box (with button actions and tab targets), without
values, styles, goal or provenance (`App.layout_hash`). Its bucket is the hash mod 16; train owns
buckets 0-13, holdout 14, adversarial 15. Task `index` of a split has seed `seed_start + index`
and level `levels[index % len(levels)]`; attempts 0, 1, ... of the seed are generated until the
app's layout belongs to the split, and the attempt is stored in the task's params. So no held-out
app shows a training layout, whatever the seeds.

Adversarial tasks cycle through variants: each theme of `adversarial_variants.themes`, each
resolution of `adversarial_variants.sizes` (the app generated for that screen size, its own
layout owned by the split), `distractors:+k` (more distractors than training ever has) and
`moved` (the app's widgets shifted off the grid: the split owns the layout BEFORE the shift, so a
moved app is never a moved training app). The level advances once per full cycle of variants.

Holdout and adversarial tasks are distinct: an attempt that repeats an earlier task of the split
(same app content; adversarial: and theme) is skipped, so they are built in order; train tasks
may repeat and are computed on demand (`Split` is a lazy, memoising sequence).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from vlrl.envs.base import Task
from vlrl.envs.gui.app import App
from vlrl.envs.gui.generate import GENERATOR_VERSION, apply_moved, generate_app
from vlrl.envs.gui.render import THEMES
from vlrl.envs.lazy_split import LazySplit
from vlrl.errors import VlrlError

SPLIT_RULE = "layout16-v1"
BUCKETS = 16
SPLIT_BUCKETS = {"train": frozenset(range(14)), "holdout": frozenset({14}), "adversarial": frozenset({15})}
MAX_ATTEMPTS = 4096
TASK_PARAMS = {"level", "width", "height", "distractors", "theme", "variant", "moved", "attempt"}


def layout_split(app: App) -> str:
    """The split that owns the app's layout: train, holdout or adversarial."""
    bucket = int(app.layout_hash()[:16], 16) % BUCKETS
    return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def _variants(config: Any) -> list[dict[str, Any]]:
    adv = config.adversarial_variants
    lo, hi = config.distractors
    variants: list[dict[str, Any]] = [{"variant": f"theme:{t}", "theme": t} for t in adv.themes]
    variants += [{"variant": f"resolution:{s}", "width": s, "height": s} for s in adv.sizes]
    if adv.extra_distractors:
        k = adv.extra_distractors
        variants.append({"variant": f"distractors:+{k}", "distractors": [hi + 1, hi + k]})
    if adv.moved:
        variants.append({"variant": "moved", "moved": True})
    return variants or [{"variant": "none"}]


def _params(config: Any, split: str, index: int) -> dict[str, Any]:
    levels = config.levels
    params: dict[str, Any] = {
        "level": levels[index % len(levels)],
        "width": config.width,
        "height": config.height,
        "distractors": list(config.distractors),
        "theme": config.theme,
        "variant": "none",
        "moved": False,
    }
    if split == "adversarial":
        variants = _variants(config)
        params["level"] = levels[(index // len(variants)) % len(levels)]
        params.update(variants[index % len(variants)])
    return params


def _base_app(seed: int, params: dict[str, Any], attempt: int) -> App:
    return generate_app(
        params["level"],
        params["width"],
        params["height"],
        seed,
        attempt=attempt,
        distractors=tuple(params["distractors"]),
    )


def app_for_params(seed: int, params: dict[str, Any]) -> App:
    """The app a task shows: its base app, then the variant (moved) applied."""
    app = _base_app(seed, params, params["attempt"])
    return apply_moved(app, seed) if params["moved"] else app


def make_task(config: Any, split: str, index: int, used: set[tuple[str, str]] | None = None) -> Task:
    """Task `index` of a split: the first attempt whose base app's layout the split owns (and, with
    `used`, that repeats no earlier task of the split)."""
    params = _params(config, split, index)
    seed = getattr(config, split).seed_start + index
    for attempt in range(MAX_ATTEMPTS):
        base = _base_app(seed, params, attempt)
        if layout_split(base) != split:
            continue
        if used is not None:
            app = apply_moved(base, seed) if params["moved"] else base
            key = (app.content_hash(), params["theme"])
            if key in used:
                continue
            used.add(key)
        return Task(config.name, split, index, seed, {**params, "attempt": attempt})
    raise VlrlError(
        f"env.{split}: task {index} found no new level-{params['level']} app in {MAX_ATTEMPTS} attempts; lower "
        f"env.{split}.count"
    )


@lru_cache(maxsize=1024)
def _cached_app(seed: int, params_json: str) -> App:
    return app_for_params(seed, json.loads(params_json))


def app_for_task(task: Task) -> App:
    """The app of a task (memoised: the G episodes of a group share it)."""
    if task.env != "gui":
        raise VlrlError(f"task {task.task_id} is for env '{task.env}', not gui")
    missing = TASK_PARAMS - set(task.params)
    if missing:
        raise VlrlError(f"task {task.task_id} lacks gui params {sorted(missing)}")
    if task.params["theme"] not in THEMES:
        raise VlrlError(f"task {task.task_id}: unknown theme {task.params['theme']!r}; known: {', '.join(THEMES)}")
    return _cached_app(task.seed, json.dumps(task.params, sort_keys=True))


def train_overlap(tasks: Sequence[Task]) -> list[Task]:
    """Tasks whose base layout train owns (a moved app is judged by its layout before the shift)."""
    return [t for t in tasks if layout_split(_base_app(t.seed, t.params, t.params["attempt"])) == "train"]


def gui_split_version(config: Any, split: str) -> str:
    """12-hex-digit hash of everything that decides a split's tasks."""
    spec: dict[str, Any] = {
        "rule": SPLIT_RULE,
        "generator": GENERATOR_VERSION,
        "split": split,
        "seed_start": getattr(config, split).seed_start,
        "count": getattr(config, split).count,
        "levels": list(config.levels),
        "size": [config.width, config.height],
        "distractors": list(config.distractors),
        "theme": config.theme,
    }
    if split == "adversarial":
        spec["variants"] = _variants(config)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


class Split(LazySplit):
    """The tasks of one split (see `LazySplit`): train on demand, held-out ones distinct and in order."""

    def __init__(self, config, split: str):
        super().__init__(config, split, gui_split_version, make_task)


def adhoc_task(
    level: int,
    seed: int,
    *,
    width: int = 128,
    height: int = 128,
    theme: str = "light",
    distractors: tuple[int, int] = (2, 4),
    moved: bool = False,
) -> Task:
    """A task outside any split (split name `adhoc`), e.g. to render or play one app by seed."""
    params = {
        "level": level,
        "width": width,
        "height": height,
        "distractors": list(distractors),
        "theme": theme,
        "variant": "moved" if moved else "none",
        "moved": moved,
        "attempt": 0,
    }
    task = Task("gui", "adhoc", 0, seed, params)
    app_for_task(task)  # raises on impossible params
    return task
