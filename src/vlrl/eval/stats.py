"""Small statistics for evaluation reports: success rates with Wilson intervals, means with
standard errors.

A success rate from a few hundred episodes is noisy; every rate we report carries a 95% Wilson
score interval (Wilson 1927), which, unlike the normal approximation p +- z*sqrt(p(1-p)/n),
stays inside [0, 1] and behaves at 0/n and n/n.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from vlrl.errors import VlrlError

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion p = successes / n.

    center = (p + z^2 / (2n)) / (1 + z^2 / n)
    half   = z / (1 + z^2 / n) * sqrt( p (1 - p) / n + z^2 / (4 n^2) )
    returns (center - half, center + half); n = 0 gives (0.0, 1.0), knowing nothing.
    """
    _check_counts(successes, n)
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n))
    # At 0/n and n/n the bound is exactly 0 or 1 in exact arithmetic; don't let rounding show.
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


@dataclass(frozen=True)
class Proportion:
    """A success count out of n trials, e.g. solved mazes out of evaluated mazes."""

    successes: int
    n: int

    def __post_init__(self) -> None:
        _check_counts(self.successes, self.n)

    @property
    def rate(self) -> float:
        """successes / n (0.0 when n = 0)."""
        return self.successes / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        """95% Wilson score interval of the rate."""
        return wilson_interval(self.successes, self.n)

    def format(self) -> str:
        """The rate and its interval in percent, e.g. '42.0% [35.4, 48.9]'."""
        low, high = self.interval
        return f"{100 * self.rate:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def intervals_overlap(a: Proportion, b: Proportion) -> bool:
    """True when the 95% Wilson intervals of a and b overlap (touching counts as overlap).

    Non-overlapping intervals are a conservative sign of a real difference; overlapping ones do
    not prove there is none.
    """
    a_low, a_high = a.interval
    b_low, b_high = b.interval
    return a_low <= b_high and b_low <= a_high


def mean_and_stderr(values: Iterable[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) = (sum x / n, s / sqrt(n)), s the sample std (n - 1).

    One value gives a standard error of NaN (it is unknown); no values raise VlrlError.
    """
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        raise VlrlError("cannot take the mean of no values; evaluate at least one episode")
    mean = math.fsum(xs) / n
    if n == 1:
        return mean, math.nan
    variance = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    return mean, math.sqrt(variance / n)


def _check_counts(successes: int, n: int) -> None:
    if n < 0 or successes < 0 or successes > n:
        raise VlrlError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
