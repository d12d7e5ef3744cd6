"""The strict base of every config model, and the did-you-mean hint of config errors.

Shared by the run config (`vlrl.config`) and the env configs (`vlrl.envs.config`, each env's own
config class), which therefore do not import each other.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name nearest to a mistyped `word`, or None when none is close."""
    matches = difflib.get_close_matches(word, list(known), n=1)
    return matches[0] if matches else None


def did_you_mean(word: str, known: Iterable[str], prefix: str = "") -> str:
    """`did you mean 'PREFIX.NAME'?` for the closest known name, else `known: a, b, c`."""
    known = list(known)
    close = closest(word, known)
    if close is not None:
        return f"did you mean '{prefix}{close}'?"
    return f"known: {', '.join(known)}" if known else ""
