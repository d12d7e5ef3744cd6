"""The maze's one-turn drills: `maze_plan` (answer the whole path at once) and `maze_look` (say
which moves are open from the agent's square, the perception drill). Both are `MazeEpisode`s, so
they share the maze env's splits, rendering, traces and replay; only the turn rules differ.
"""

from __future__ import annotations

from vlrl.envs.base import StepResult, register_env
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.envs.maze.env import (
    LOOK_INSTRUCTION,
    LOOK_INVALID_FEEDBACK,
    LOOK_RIGHT_FEEDBACK,
    LOOK_SYSTEM_PROMPT,
    LOOK_WRONG_FEEDBACK,
    PLAN_FAIL_FEEDBACK,
    PLAN_INSTRUCTION,
    PLAN_INVALID_FEEDBACK,
    PLAN_SUCCESS_FEEDBACK,
    PLAN_SYSTEM_PROMPT,
    MazeEpisode,
    parse_plan,
)
from vlrl.envs.maze.maze import MOVES
from vlrl.envs.maze.oracle import optimal_actions
from vlrl.envs.maze.rewards import turn_reward


@register_env("maze_plan", config=MazeEnvConfig)
class MazePlanEnv(MazeEpisode):
    """Single-turn maze: the model answers the whole path at once."""

    system_prompt = PLAN_SYSTEM_PROMPT

    def _first_text(self) -> str:
        return PLAN_INSTRUCTION

    def optimal_turns(self) -> int:
        """Moves of the shortest path (the plan's length when optimal)."""
        return self.dist[self.maze.start[0]][self.maze.start[1]]

    def episode_metrics(self) -> dict[str, float]:
        """As the multi-turn env, with `turns` = moves of the plan and `solvable` always 1."""
        metrics = super().episode_metrics()
        plan = self.turns[0]["plan"] if self.turns else None
        metrics["turns"] = float(len(plan or []))
        metrics["solvable"] = 1.0
        return metrics

    def step(self, action_text: str) -> StepResult:
        """Score a whole plan by simulating it from the start; the episode ends."""
        self._check_running()
        plan = parse_plan(action_text)
        before = self._distance()
        bumps = 0
        if plan is None:
            self.invalid_actions += 1
            feedback = PLAN_INVALID_FEEDBACK
        else:
            for move in plan:
                moved_to = self.maze.move(self.pos, move)
                if moved_to is None:
                    bumps += 1
                else:
                    self.pos = moved_to
            self.success = self.pos == self.maze.goal
            feedback = PLAN_SUCCESS_FEEDBACK if self.success else PLAN_FAIL_FEEDBACK
        self.wall_bumps += bumps
        self.done = True
        reward = turn_reward(
            self.config.rewards,
            valid=plan is not None,
            bumps=bumps,
            distance_before=before,
            distance_after=self._distance(),
            success=self.success,
            steps=len(plan) if plan else 1,
        )
        self.episode_return += reward
        self.turns.append(
            {
                "response": action_text,
                "plan": plan,
                "valid": plan is not None,
                "bumps": bumps,
                "reward": reward,
                "feedback": feedback,
                "position": list(self.pos),
            }
        )
        info = {
            "action": None if plan is None else " ".join(plan),
            "valid": plan is not None,
            "bumped": bumps > 0,
            "bumps": bumps,
            "success": self.success,
            "feedback": feedback,
            "position": list(self.pos),
            "distance": self._distance(),
            "turn": 1,
            "truncated": False,
        }
        return StepResult(None, reward, True, info)

    def format_response(self, text: str) -> str:
        """A typed path as a response: `right down` -> `<answer>right down</answer>` (tagged text is kept)."""
        return text if "<answer>" in text.lower() else f"<answer>{text}</answer>"

    def oracle_response(self) -> str:
        """`<answer>...</answer>` with the shortest path from the start."""
        self._check_started("oracle_response")
        return "<answer>" + " ".join(optimal_actions(self.maze, self.maze.start, self.maze.goal)) + "</answer>"


@register_env("maze_look", config=MazeEnvConfig)
class MazeLookEnv(MazeEpisode):
    """Single-turn perception drill: name the open moves around the agent (see the module docstring)."""

    system_prompt = LOOK_SYSTEM_PROMPT

    def _first_text(self) -> str:
        return LOOK_INSTRUCTION

    def open_moves(self) -> list[str]:
        """The moves that are not blocked from the agent's block, in MOVES order."""
        self._check_started("open_moves")
        return [m for m in MOVES if self.maze.move(self.pos, m) is not None]

    def optimal_turns(self) -> int:
        return 1

    def episode_metrics(self) -> dict[str, float]:
        """As the multi-turn env, with `turns` 1 and `solvable` always 1."""
        metrics = super().episode_metrics()
        metrics["turns"] = float(len(self.turns))
        metrics["solvable"] = 1.0
        return metrics

    def step(self, action_text: str) -> StepResult:
        """Score the named moves against the open ones; the episode ends. A move named twice is invalid."""
        self._check_running()
        named = parse_plan(action_text)
        if named is not None and len(set(named)) != len(named):
            named = None
        if named is None:
            self.invalid_actions += 1
            feedback = LOOK_INVALID_FEEDBACK
        else:
            self.success = set(named) == set(self.open_moves())
            feedback = LOOK_RIGHT_FEEDBACK if self.success else LOOK_WRONG_FEEDBACK
        self.done = True
        reward = turn_reward(
            self.config.rewards,
            valid=named is not None,
            bumps=0,
            distance_before=0,
            distance_after=0,
            success=self.success,
        )
        self.episode_return += reward
        self.turns.append(
            {
                "response": action_text,
                "answer": named,
                "valid": named is not None,
                "reward": reward,
                "feedback": feedback,
                "position": list(self.pos),
            }
        )
        info = {
            "action": None if named is None else " ".join(named),
            "valid": named is not None,
            "bumped": False,
            "success": self.success,
            "feedback": feedback,
            "position": list(self.pos),
            "distance": self._distance(),
            "turn": 1,
            "truncated": False,
        }
        return StepResult(None, reward, True, info)

    def random_response(self, rng) -> str:
        """A random non-empty set of moves (SFT noise)."""
        return "<answer>" + " ".join(m for m in MOVES if rng.random() < 0.5 or m == MOVES[0]) + "</answer>"

    def format_response(self, text: str) -> str:
        """Typed moves as a response: `up left` -> `<answer>up left</answer>` (tagged text is kept)."""
        return text if "<answer>" in text.lower() else f"<answer>{text}</answer>"

    def oracle_response(self) -> str:
        """`<answer>...</answer>` with the open moves."""
        return "<answer>" + " ".join(self.open_moves()) + "</answer>"
