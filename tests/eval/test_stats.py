"""Evaluation statistics against published / hand-computed values."""

from __future__ import annotations

import math

import pytest

from vlrl.errors import VlrlError
from vlrl.eval.stats import (
    PairedComparison,
    Proportion,
    intervals_overlap,
    mcnemar_exact_p,
    mean_and_stderr,
    pair_outcomes,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        (0, 10, 0.0, 0.2775328),
        (5, 10, 0.2365931, 0.7634069),
        (10, 10, 0.7224672, 1.0),
        (81, 263, 0.2552885, 0.3662096),  # textbook example: approx [0.2553, 0.3662]
        (1, 1, 0.2065493, 1.0),
    ],
)
def test_wilson_interval_known_values(successes: int, n: int, low: float, high: float) -> None:
    got_low, got_high = wilson_interval(successes, n)
    assert got_low == pytest.approx(low, abs=1e-7)
    assert got_high == pytest.approx(high, abs=1e-7)


def test_wilson_interval_edges_are_exact() -> None:
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_interval_rejects_impossible_counts() -> None:
    for successes, n in [(11, 10), (-1, 10), (0, -1)]:
        with pytest.raises(VlrlError, match="successes <= n"):
            wilson_interval(successes, n)


def test_proportion() -> None:
    p = Proportion(42, 100)
    assert p.rate == 0.42
    assert p.interval == pytest.approx((0.3279838, 0.5179351), abs=1e-7)
    assert p.format() == "42.0% [32.8, 51.8]"
    assert Proportion(0, 0).rate == 0.0
    assert Proportion(0, 0).format() == "0.0% [0.0, 100.0]"
    with pytest.raises(VlrlError):
        Proportion(3, 2)


def test_intervals_overlap() -> None:
    # 21/50 -> [0.294, 0.558], 30/50 -> [0.462, 0.724], 10/50 -> [0.112, 0.330],
    # 40/50 -> [0.670, 0.888]
    assert intervals_overlap(Proportion(21, 50), Proportion(30, 50))
    assert intervals_overlap(Proportion(30, 50), Proportion(21, 50))
    assert not intervals_overlap(Proportion(10, 50), Proportion(40, 50))
    assert not intervals_overlap(Proportion(40, 50), Proportion(10, 50))


def test_mean_and_stderr() -> None:
    # mean 3.5; sample variance ((2.5^2 + 1.5^2 + 0.5^2 + 3.5^2) / 3) = 7; stderr sqrt(7 / 4)
    mean, stderr = mean_and_stderr([1, 2, 4, 7])
    assert mean == 3.5
    assert stderr == pytest.approx(1.3228757, abs=1e-7)
    mean, stderr = mean_and_stderr(iter([0.25]))
    assert mean == 0.25 and math.isnan(stderr)
    with pytest.raises(VlrlError, match="no values"):
        mean_and_stderr([])


def test_mcnemar_exact_p_by_hand():
    # b = 10, c = 2: 2 * (C(12,0) + C(12,1) + C(12,2)) / 2^12 = 2 * 79 / 4096
    assert mcnemar_exact_p(10, 2) == pytest.approx(158 / 4096, abs=1e-15) and round(mcnemar_exact_p(10, 2), 4) == 0.0386
    assert mcnemar_exact_p(2, 10) == mcnemar_exact_p(10, 2)  # two-sided
    assert mcnemar_exact_p(14, 0) == pytest.approx(2 / 2**14)
    assert mcnemar_exact_p(5, 5) == 1.0 and mcnemar_exact_p(0, 0) == 1.0  # nothing discordant: no evidence
    with pytest.raises(VlrlError):
        mcnemar_exact_p(-1, 3)


def test_paired_interval_matches_the_published_newcombe_example():
    # Cavo et al. 2012 (Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables, ch. 8):
    # 59 both, 6 only before, 16 only after, 80 neither -> -0.0621 (95% CI -0.1186 to -0.0046)
    pc = PairedComparison(59, 6, 16, 80)
    assert round(pc.difference, 4) == -0.0621
    assert [round(x, 4) for x in pc.interval] == [-0.1186, -0.0046]
    swapped = PairedComparison(59, 16, 6, 80)  # A and B exchanged: the interval mirrors
    assert swapped.interval == pytest.approx((-pc.interval[1], -pc.interval[0]))
    assert PairedComparison(0, 0, 0, 0).interval == (-1.0, 1.0)
    assert PairedComparison(10, 0, 0, 0).interval[0] <= 0 <= PairedComparison(10, 0, 0, 0).interval[1]


def test_pairing_is_by_task_key_not_position():
    a = {"t1": True, "t2": True, "t3": False, "t4": True}
    b = {"t4": False, "t3": True, "t2": True, "t1": False}  # another order, same tasks
    pc = pair_outcomes(a, b)
    assert (pc.both, pc.only_a, pc.only_b, pc.neither) == (1, 2, 1, 0)
    with pytest.raises(
        VlrlError, match=r"cannot pair A and B: they were evaluated on different tasks \(1 only in A, 1 only in B"
    ):
        pair_outcomes(a, {**{k: v for k, v in b.items() if k != "t4"}, "t5": True})
