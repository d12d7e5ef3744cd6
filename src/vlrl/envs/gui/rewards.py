"""GUI rewards, term by term, from `GuiRewardConfig`.

The reward of one turn is the sum of:

- `step_cost` (<= 0): on every turn.
- `invalid_action` (<= 0): a response with no parseable action, a click outside the screen, or
  `type` with no text field focused (the turn changes nothing).
- `misclick` (<= 0): a click inside the screen that hits no widget.
- `subgoal` (>= 0) x (potential after the turn - potential before), the potential being the goal
  fields at their target value, minus the other fields changed from their initial value, plus 1
  once the goal holds (`app.subgoal_potential`). It telescopes: an episode's total is subgoal x
  (final potential - initial potential), so it cannot be farmed by undoing and redoing.
- `success` (terminal): when the episode ends with the goal holding (with `stop_required`, only
  by answering `stop` then). The reference reward is success=1 and every other term 0.
"""

from __future__ import annotations

from typing import Any


def turn_reward(
    rewards: Any, *, invalid: bool, misclick: bool, potential_before: int, potential_after: int, success: bool
) -> float:
    """Reward of one turn (see the module docstring for each term)."""
    total = rewards.step_cost
    if invalid:
        total += rewards.invalid_action
    if misclick:
        total += rewards.misclick
    total += rewards.subgoal * (potential_after - potential_before)
    if success:
        total += rewards.success
    return float(total)
