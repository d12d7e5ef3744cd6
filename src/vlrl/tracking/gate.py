"""The promotion gate: may a candidate adapter replace production? Pure functions, no MLflow.

A candidate passes when, on the SAME evaluation tasks (same split version, task list hash and
decoding) as the baseline (the current production adapter, or the base model when there is none):

    holdout      rate(candidate) - rate(baseline) >= registry.holdout_margin (a gain worth having),
                 and McNemar's exact test on the tasks only one of them solved (b: only the
                 candidate, c: only the baseline) gives p < registry.max_p_value with b > c (a gain
                 that is not luck; paired task by task, so the baseline record must carry (b, c));
    adversarial  rate(candidate) >= rate(baseline) - registry.max_adversarial_drop.

The paired test replaced "the two 95% Wilson intervals do not overlap": both models play the same
tasks, and most tasks are solved by both or by neither, so the unpaired intervals hid real gains.

Every check is computed, so a refusal lists all reasons with their numbers. Missing evaluations
fail their check with a message that says which `vlrl eval` to run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vlrl.errors import VlrlError
from vlrl.eval.stats import PairedComparison, Proportion

EVAL_FIELDS = ("successes", "n", "decoding", "split_version", "tasks_hash")


@dataclass(frozen=True)
class EvalRecord:
    """One model's success count on one split's task list, as the gate needs it."""

    split: str
    successes: int
    n: int
    decoding: str
    split_version: str
    tasks_hash: str
    # On a baseline record paired with the candidate: (b, c) = tasks only the candidate solved,
    # tasks only this model solved, on the same tasks. None when the outcomes were not paired.
    discordant: tuple[int, int] | None = None

    @property
    def proportion(self) -> Proportion:
        """successes out of n, with its Wilson interval."""
        return Proportion(self.successes, self.n)

    def same_tasks(self, other: EvalRecord) -> bool:
        """True when both were evaluated on the same tasks with the same decoding."""
        return (self.split_version, self.tasks_hash, self.decoding) == (
            other.split_version,
            other.tasks_hash,
            other.decoding,
        )

    def describe(self) -> str:
        """e.g. '42.0% [35.4, 48.9] (84/200)'."""
        return f"{self.proportion.format()} ({self.successes}/{self.n})"

    def to_json(self) -> dict[str, Any]:
        """A plain dict (without `discordant` when unpaired); `from_json` reads it back."""
        data = asdict(self)
        if self.discordant is None:
            del data["discordant"]
        else:
            data["discordant"] = list(self.discordant)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalRecord:
        """Read `to_json` output (or an evaluation summary with the same keys)."""
        try:
            pair = data.get("discordant")
            discordant = None if pair is None else (int(pair[0]), int(pair[1]))
            return cls(
                str(data["split"]),
                int(data["successes"]),
                int(data["n"]),
                str(data["decoding"]),
                str(data["split_version"]),
                str(data["tasks_hash"]),
                discordant,
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise VlrlError(f"evaluation record lacks or has a bad field ({exc})") from None

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> EvalRecord:
        """From an `EvalResult.summary()` written by `vlrl eval` (which records the task list hash)."""
        missing = [k for k in ("split", *EVAL_FIELDS) if k not in summary]
        if missing:
            raise VlrlError(f"evaluation summary lacks {missing}; re-run `vlrl eval` with this version of vlrl")
        return cls.from_json(summary)


def decoding_kind(decoding: str) -> str:
    """'greedy' or 'sampled' from a summary's decoding label such as 'sampled T=1.0'."""
    return "sampled" if decoding.startswith("sampled") else "greedy"


@dataclass
class GateCheck:
    """One rule of the gate: its name, whether it passed, why, and the numbers behind it."""

    name: str
    passed: bool
    detail: str
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass
class GateDecision:
    """All checks of one promotion attempt; passed only when every check passed."""

    candidate: str
    baseline: str
    checks: list[GateCheck]

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(c.passed for c in self.checks)

    def reasons(self) -> str:
        """The failed checks' details joined into one line (or 'all checks passed')."""
        failed = [c.detail for c in self.checks if not c.passed]
        return "; ".join(failed) if failed else "all checks passed"

    def to_json(self) -> dict[str, Any]:
        """For the audit log and the version's gate tag."""
        return {
            "passed": self.passed,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "checks": [asdict(c) for c in self.checks],
        }


def _numbers(c: EvalRecord, b: EvalRecord) -> dict[str, Any]:
    c_lo, c_hi = c.proportion.interval
    b_lo, b_hi = b.proportion.interval
    return {
        "candidate": {"successes": c.successes, "n": c.n, "rate": c.proportion.rate, "low": c_lo, "high": c_hi},
        "baseline": {"successes": b.successes, "n": b.n, "rate": b.proportion.rate, "low": b_lo, "high": b_hi},
        "split_version": c.split_version,
        "tasks_hash": c.tasks_hash,
        "decoding": c.decoding,
    }


def _comparable(split: str, c: EvalRecord | None, b: EvalRecord | None, baseline: str) -> GateCheck | None:
    """A failed check when the two records are missing or not on the same tasks, else None."""
    if c is None:
        return GateCheck(
            split,
            False,
            f"the candidate has no {split} evaluation; run `vlrl eval --split {split} -o DIR` "
            "and register it again with --eval DIR",
        )
    if b is None:
        return GateCheck(
            split,
            False,
            f"no {split} evaluation of the {baseline} on the candidate's tasks; evaluate both in "
            f"one `vlrl eval --split {split}` run and register the candidate again with --eval DIR",
        )
    if not c.same_tasks(b):
        return GateCheck(
            split,
            False,
            f"{split}: the candidate and the {baseline} were evaluated on different tasks "
            f"(split {c.split_version}/{b.split_version}, tasks {c.tasks_hash[:8]}/{b.tasks_hash[:8]}, "
            f"decoding {c.decoding}/{b.decoding}); evaluate both in one `vlrl eval` run",
        )
    return None


def holdout_check(
    c: EvalRecord | None, b: EvalRecord | None, margin: float, baseline: str, max_p_value: float = 0.05
) -> list[GateCheck]:
    """Margin and McNemar's paired test on the holdout split (two checks)."""
    bad = _comparable("holdout", c, b, baseline)
    if bad is not None:
        return [bad]
    gain = c.proportion.rate - b.proportion.rate
    numbers = {**_numbers(c, b), "gain": gain, "margin": margin}
    margin_ok = gain >= margin - 1e-12
    checks = [
        GateCheck(
            "holdout_margin",
            margin_ok,
            f"holdout {c.describe()} vs {baseline} {b.describe()}: {100 * gain:+.1f} points "
            f"{'>=' if margin_ok else '<'} margin {100 * margin:.1f}",
            numbers,
        )
    ]
    if b.discordant is None:
        checks.append(
            GateCheck(
                "holdout_paired_test",
                False,
                f"holdout: no task-by-task outcomes of the candidate and the {baseline} to pair; evaluate "
                "both with this version of vlrl (summary.json records every task's outcome) and register "
                "the candidate again with --eval DIR of both",
                numbers,
            )
        )
        return checks
    only_c, only_b = b.discordant
    both = c.successes - only_c
    neither = c.n - both - only_c - only_b
    if min(both, neither, only_c, only_b) < 0 or both + only_b != b.successes:
        raise VlrlError(
            f"holdout: paired counts b={only_c}, c={only_b} do not fit {c.successes}/{c.n} and "
            f"{b.successes}/{b.n}; register the candidate again with --eval DIR"
        )
    pair = PairedComparison(both, only_c, only_b, neither)
    p_value = pair.p_value
    low, high = pair.interval
    passed = only_c > only_b and p_value < max_p_value
    paired = {
        **numbers,
        "b": only_c,
        "c": only_b,
        "p_value": p_value,
        "max_p_value": max_p_value,
        "difference_low": low,
        "difference_high": high,
    }
    direction = "better" if only_c > only_b else "not better"
    checks.append(
        GateCheck(
            "holdout_paired_test",
            passed,
            f"holdout paired on {pair.n} tasks: only the candidate solved {only_c}, only the {baseline} "
            f"{only_b} ({direction}); McNemar p = {p_value:.4g} {'<' if p_value < max_p_value else '>='} "
            f"{max_p_value:g}; difference {pair.format_difference()} points",
            paired,
        )
    )
    return checks


def adversarial_check(c: EvalRecord | None, b: EvalRecord | None, max_drop: float, baseline: str) -> list[GateCheck]:
    """Adversarial success may fall at most `max_drop` below the baseline's."""
    bad = _comparable("adversarial", c, b, baseline)
    if bad is not None:
        return [bad]
    change = c.proportion.rate - b.proportion.rate
    ok = change >= -max_drop - 1e-12
    return [
        GateCheck(
            "adversarial_drop",
            ok,
            f"adversarial {c.describe()} vs {baseline} {b.describe()}: {100 * change:+.1f} points "
            f"({'within' if ok else 'beyond'} the allowed drop of {100 * max_drop:.1f})",
            {**_numbers(c, b), "change": change, "max_drop": max_drop},
        )
    ]


def promotion_gate(
    candidate: dict[str, EvalRecord],
    baseline: dict[str, EvalRecord],
    *,
    candidate_label: str,
    baseline_label: str,
    holdout_margin: float,
    max_adversarial_drop: float,
    max_p_value: float = 0.05,
) -> GateDecision:
    """Decide a promotion from per-split records of the candidate and the baseline (the baseline's
    holdout record carries the paired discordant counts)."""
    checks = holdout_check(
        candidate.get("holdout"), baseline.get("holdout"), holdout_margin, baseline_label, max_p_value
    )
    checks += adversarial_check(
        candidate.get("adversarial"), baseline.get("adversarial"), max_adversarial_drop, baseline_label
    )
    return GateDecision(candidate_label, baseline_label, checks)
