"""Maze rewards, term by term, from `RewardConfig`.

The reward of one turn is the sum of:

- `step_cost` (<= 0): on every turn, whatever the action (in the plan variant: once per move of
  the plan, so shorter plans score higher).
- `invalid_action` (<= 0): when the response has no parseable action (the turn is then a no-op).
- `wall_bump` (<= 0): for each attempted move into a wall (the agent stays where it is).
- `progress` (>= 0) x (BFS distance to the goal before the turn - after it): +progress for a
  move that gets one cell closer, -progress for one that gets one cell farther, 0 for a bump or
  stop. Because it telescopes, an episode's total progress reward is
  progress x (start distance - final distance), so it cannot be farmed by going back and forth.
- `success` (terminal): when the episode ends on the goal (with `stop_required`, only by saying
  `stop` there). The reference reward is success=1 and every other term 0.

The episode return is the sum of its turns' rewards. The oracle scores `max_return`, which is
the largest return any play can reach whenever success + progress*d >= step_cost*(1 - optimal
turns), i.e. whenever solving beats stopping at once (true for all non-absurd settings).
"""

from __future__ import annotations

from vlrl.envs.maze.config import RewardConfig


def turn_reward(
    rewards: RewardConfig,
    *,
    valid: bool,
    bumps: int,
    distance_before: int,
    distance_after: int,
    success: bool,
    steps: int = 1,
) -> float:
    """Reward of one turn (see the module docstring for each term)."""
    total = rewards.step_cost * steps
    if not valid:
        total += rewards.invalid_action
    total += rewards.wall_bump * bumps
    total += rewards.progress * (distance_before - distance_after)
    if success:
        total += rewards.success
    return float(total)


def max_return(rewards: RewardConfig, distance: int, stop_required: bool, plan: bool = False) -> float:
    """The return of optimal play from a start `distance` moves from the goal."""
    steps = distance if plan else distance + (1 if stop_required else 0)
    return float(rewards.success + rewards.progress * distance + rewards.step_cost * steps)
