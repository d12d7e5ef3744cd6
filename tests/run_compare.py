"""Comparing two runs' records: shared by the reproducibility, resume and recovery tests."""

from __future__ import annotations

import math

TIMING_PREFIXES = ("time/", "throughput/")


def same(a, b) -> bool:
    """Equality where NaN equals NaN (a record may hold non-finite values, e.g. under fault injection)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def step_numbers(history, skip: tuple[str, ...] = TIMING_PREFIXES) -> list[dict]:
    """The per-step records without the keys that legitimately differ between runs (timings)."""
    return [{k: v for k, v in h.items() if not k.startswith(skip)} for h in history]
