"""Small statistics for evaluation reports: success rates with Wilson intervals, paired
comparisons of two models on the same tasks (McNemar's exact test), means with standard errors.

A success rate from a few hundred episodes is noisy; every rate we report carries a 95% Wilson
score interval (Wilson 1927), which, unlike the normal approximation p +- z*sqrt(p(1-p)/n),
stays inside [0, 1] and behaves at 0/n and n/n.

Two models evaluated on the SAME tasks are compared task by task (`PairedComparison`): only the
discordant tasks, solved by one model and not the other, say which is better. Comparing the two
Wilson intervals ignores that pairing and is far too conservative (most tasks are solved by both
or by neither); McNemar's exact test on the discordant counts is the paired test.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
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


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b tasks won only by the first model, c only by the second.

    Under "no difference" each discordant task is a fair coin: b ~ Binomial(b + c, 1/2), so
    p = P(a result at least as lopsided) = min(1, 2 * sum_{k <= min(b, c)} C(b+c, k) / 2^(b+c))
    (scipy.stats.binomtest). No discordant task gives p = 1. Example: b = 10, c = 2 -> 0.0386.
    """
    _check_counts(b, b + c)
    if b + c == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(b, b + c, 0.5, alternative="two-sided").pvalue)


@dataclass(frozen=True)
class PairedComparison:
    """Models A and B on the same n tasks: the 2 x 2 table of their per-task outcomes.

    `only_a` and `only_b` are McNemar's b and c (tasks solved by one model and not the other).
    """

    both: int
    only_a: int
    only_b: int
    neither: int

    def __post_init__(self) -> None:
        if min(self.both, self.only_a, self.only_b, self.neither) < 0:
            raise VlrlError(f"paired counts must be >= 0, got {self}")

    @property
    def n(self) -> int:
        """Tasks both models played."""
        return self.both + self.only_a + self.only_b + self.neither

    @property
    def difference(self) -> float:
        """rate(A) - rate(B) = (b - c) / n (0.0 when n = 0)."""
        return (self.only_a - self.only_b) / self.n if self.n else 0.0

    @property
    def p_value(self) -> float:
        """Two-sided exact McNemar p-value of b against c."""
        return mcnemar_exact_p(self.only_a, self.only_b)

    @property
    def interval(self) -> tuple[float, float]:
        """95% interval of the paired difference: Newcombe's (1998) square-and-add interval.

        From the Wilson intervals (l1, u1) of A's rate p1 and (l2, u2) of B's rate p2 and the
        correlation phi of the two outcomes (A = both, B = only_a, C = only_b, D = neither):
            phi = C' / sqrt((A+B)(C+D)(A+C)(B+D)),  C' = AD - BC - n/2 if AD - BC > n/2, AD - BC if
                  it is negative, else 0 (Newcombe's continuity-corrected phi; 0 when a margin is 0)
            low  = d - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)
            high = d + sqrt((u1 - p1)^2 - 2 phi (u1 - p1)(p2 - l2) + (p2 - l2)^2)
        """
        n = self.n
        if n == 0:
            return -1.0, 1.0
        a, b, c, d = self.both, self.only_a, self.only_b, self.neither
        p1, p2 = (a + b) / n, (a + c) / n
        l1, u1 = wilson_interval(a + b, n)
        l2, u2 = wilson_interval(a + c, n)
        margins = (a + b) * (c + d) * (a + c) * (b + d)
        cross = a * d - b * c
        corrected = cross - n / 2 if cross > n / 2 else cross if cross < 0 else 0.0
        phi = corrected / math.sqrt(margins) if margins else 0.0
        diff = p1 - p2
        low = diff - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
        high = diff + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
        return max(-1.0, low), min(1.0, high)

    def format_difference(self) -> str:
        """The difference in points with its interval, e.g. '+8.0 [+2.1, +13.6]'."""
        low, high = self.interval
        return f"{100 * self.difference:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"

    def to_json(self) -> dict[str, float | int]:
        """The table, the difference with its interval and the p-value, as plain numbers."""
        low, high = self.interval
        return {
            "n": self.n,
            "both": self.both,
            "only_a": self.only_a,
            "only_b": self.only_b,
            "neither": self.neither,
            "difference": self.difference,
            "difference_low": low,
            "difference_high": high,
            "p_value": self.p_value,
        }


def pair_outcomes(
    a: Mapping[str, bool], b: Mapping[str, bool], label_a: str = "A", label_b: str = "B"
) -> PairedComparison:
    """The paired table of two models' per-task outcomes ({task key: solved}), matched by task key.

    Refuses (VlrlError) unless both played exactly the same tasks: a paired test over different
    task sets would compare nothing.
    """
    only_in_a, only_in_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_in_a or only_in_b:
        example = (only_in_a or only_in_b)[0]
        raise VlrlError(
            f"cannot pair {label_a} and {label_b}: they were evaluated on different tasks ({len(only_in_a)} only in "
            f"{label_a}, {len(only_in_b)} only in {label_b}, e.g. {example}); evaluate both on the same split and tasks"
        )
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for key, solved in a.items():
        counts[(bool(solved), bool(b[key]))] += 1
    return PairedComparison(counts[(True, True)], counts[(True, False)], counts[(False, True)], counts[(False, False)])


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
