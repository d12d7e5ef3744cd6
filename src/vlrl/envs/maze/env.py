"""The maze as a multi-turn environment (`maze`), a single-turn planning task (`maze_plan`) and a
single-turn perception drill (`maze_look`); the two drills' classes are in drills.py, their texts
here with every other prompt text (PROMPT_TEXTS).

`maze`: each turn the model sees the maze image and answers one action inside
`<action>...</action>` (up, down, left, right, stop; case-insensitive, whitespace tolerated, the
LAST tag counts). A move into a wall leaves the agent in place ("Cannot move right into a wall.":
the feedback names the move, because the picture after a bump is the same as before it, and the
text is what tells the model its last move failed);
a response without a valid action is an invalid turn. `stop` ends the episode, a success iff the
agent is on the goal. With `stop_required=False`, arriving on the goal ends the episode with
success. After `max_turns` turns the episode ends without success.

`maze_look`: one turn, a perception drill: the model names every move that is not blocked from
where it stands, `<answer>up left</answer>` (any order, each move once); it succeeds iff the set is
exactly right. With `placement: random` the agent stands anywhere, so the answer cannot be
guessed from the start corner: it checks whether a model reads the blocks around the agent (a
blind model scores the commonest set's share), and `bench/gpu_maze9.sh` can run it as a first
SFT stage (`LOOK_MIN`; off by default: it did not teach maze9 to see, bench/results/2026-12-02-h200-maze9-look-drill/).

`maze_plan`: one turn; the model answers the whole path, `<answer>right down down</answer>`
(moves separated by spaces or commas, last tag counts). The path is simulated from the start
(moves into walls are bumps that leave the agent in place) and succeeds iff it ENDS on the goal:
passing over the goal and walking on does not count. An empty or unparseable answer is invalid.

Both envs play either maze layout (`env.layout`: `cells`, or `blocks` where walls are whole
blocks); the rules are the same, a move into a wall block is a bump like a move through a wall
line. Rewards are in `rewards.py`. Every episode's `trace()` is JSON that `replay_trace` re-checks
from the maze JSON and the raw responses alone; docs/maze.md documents both formats.
"""

from __future__ import annotations

import random
import re
from typing import Any

from vlrl.envs.base import SPLITS, Env, Observation, StepResult, Task, register_env
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.envs.maze.maze import GENERATOR_VERSION, MOVES, Maze
from vlrl.envs.maze.oracle import distances_to, next_action
from vlrl.envs.maze.render import ascii_maze, render
from vlrl.envs.maze.rewards import turn_reward
from vlrl.envs.maze.splits import (
    SPLIT_RULE,
    adhoc_task,
    build_maze_split,
    maze_content_hash,
    maze_for_task,
    maze_split_version,
    train_overlap,
)
from vlrl.envs.maze.walker import DEMONSTRATORS, DfsWalker
from vlrl.envs.replay import episode_trace, replay_env_trace
from vlrl.errors import VlrlError
from vlrl.sections import did_you_mean

TRACE_FORMAT = "vlrl.trace/1"

# -- fixed texts (all of them are in PROMPT_TEXTS) ---------------------------------------------
ACTION_CHOICES = (
    "Answer with <action>up</action>, <action>down</action>, <action>left</action>, <action>right</action> or "
    "<action>stop</action>."
)
SYSTEM_PROMPT = "You are playing a maze game. Each turn you see the maze and answer with one action."
INSTRUCTION = f"You are the blue circle. Reach the red square, then stop. {ACTION_CHOICES}"
INSTRUCTION_NO_STOP = f"You are the blue circle. Reach the red square. {ACTION_CHOICES}"
MOVED_FEEDBACK = {move: f"Moved {move}." for move in MOVES}
WALL_FEEDBACK = {move: f"Cannot move {move} into a wall." for move in MOVES}
INVALID_FEEDBACK = f"Invalid action. {ACTION_CHOICES}"
STOP_ON_GOAL_FEEDBACK = "Stopped on the goal."
STOP_OFF_GOAL_FEEDBACK = "Stopped, but not on the goal."
REACHED_GOAL_FEEDBACK = "Reached the goal."
OUT_OF_TURNS_FEEDBACK = "Out of turns."
LOST_FEEDBACK = "The goal can no longer be reached in the turns left."

PLAN_SYSTEM_PROMPT = "You are playing a maze game. You see the maze and answer with your whole path."
PLAN_INSTRUCTION = (
    "You are the blue circle. Reach the red square. "
    "Answer with all your moves (up, down, left, right) in order, e.g. <answer>right down down</answer>."
)
PLAN_SUCCESS_FEEDBACK = "The path ends on the goal."
PLAN_FAIL_FEEDBACK = "The path does not end on the goal."
PLAN_INVALID_FEEDBACK = "Invalid answer. Answer with your moves, e.g. <answer>right down down</answer>."

LOOK_SYSTEM_PROMPT = "You are looking at a maze. You see the maze and say which ways are open."
LOOK_INSTRUCTION = (
    "You are the blue circle. Which moves (up, down, left, right) are not blocked by a wall? "
    "Answer with all of them, e.g. <answer>up left</answer>."
)
LOOK_RIGHT_FEEDBACK = "Those are the open moves."
LOOK_WRONG_FEEDBACK = "Those are not the open moves."
LOOK_INVALID_FEEDBACK = "Invalid answer. Answer with the open moves, each once, e.g. <answer>up left</answer>."

PROMPT_TEXTS: list[str] = [
    SYSTEM_PROMPT,
    INSTRUCTION,
    INSTRUCTION_NO_STOP,
    *MOVED_FEEDBACK.values(),
    *WALL_FEEDBACK.values(),
    INVALID_FEEDBACK,
    STOP_ON_GOAL_FEEDBACK,
    STOP_OFF_GOAL_FEEDBACK,
    REACHED_GOAL_FEEDBACK,
    OUT_OF_TURNS_FEEDBACK,
    LOST_FEEDBACK,
    PLAN_SYSTEM_PROMPT,
    PLAN_INSTRUCTION,
    PLAN_SUCCESS_FEEDBACK,
    PLAN_FAIL_FEEDBACK,
    PLAN_INVALID_FEEDBACK,
    LOOK_SYSTEM_PROMPT,
    LOOK_INSTRUCTION,
    LOOK_RIGHT_FEEDBACK,
    LOOK_WRONG_FEEDBACK,
    LOOK_INVALID_FEEDBACK,
    *(f"<action>{a}</action>" for a in (*MOVES, "stop")),
    "<answer>" + " ".join(MOVES) + "</answer>",
]

_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


def parse_action(text: str) -> str | None:
    """The action of the last `<action>` tag (lower-cased), or None if absent or not an action."""
    tags = _ACTION_TAG.findall(text or "")
    if not tags:
        return None
    action = tags[-1].strip().lower()
    return action if action in (*MOVES, "stop") else None


def parse_plan(text: str) -> list[str] | None:
    """The moves of the last `<answer>` tag, or None if absent, empty or containing a non-move."""
    tags = _ANSWER_TAG.findall(text or "")
    if not tags:
        return None
    moves = [m.lower() for m in re.split(r"[\s,]+", tags[-1]) if m]
    if not moves or any(m not in MOVES for m in moves):
        return None
    return moves


class MazeEpisode(Env):
    """State and bookkeeping shared by the maze envs: reset, metrics, trace, replay. Every subclass
    (the variants, and test envs with other rewards) reads the same maze tasks."""

    name = "maze"
    system_prompt = SYSTEM_PROMPT
    config_class = MazeEnvConfig
    generator_version = GENERATOR_VERSION
    task_group_label = "maze size"  # evaluation tables have one row per maze size

    def __init__(self, config: MazeEnvConfig, *, render_images: bool = True):
        self.config = config
        self.render_images = render_images
        self.task: Task | None = None
        self.maze: Maze | None = None

    # -- split hooks used by vlrl.envs.base ---------------------------------------------------
    @classmethod
    def build_split(cls, config: MazeEnvConfig, split: str):
        return build_maze_split(config, split)

    @classmethod
    def split_version(cls, config: MazeEnvConfig, split: str) -> str:
        return maze_split_version(config, split)

    @classmethod
    def content_hash(cls, task: Task) -> str:
        return maze_content_hash(task)

    @classmethod
    def task_group(cls, task: Task) -> str:
        """The maze size, e.g. "9x9": evaluation tables report success per size."""
        size = task.params.get("size")
        return f"{size}x{size}" if size is not None else "?"

    @classmethod
    def data_lineage(cls, config: MazeEnvConfig) -> dict[str, Any]:
        """What a run's lineage records about the maze data besides seeds: layout, split rule, sizes."""
        return {
            "layout": config.layout,
            "split_rule": SPLIT_RULE,
            "splits": {split: {"sizes": list(getattr(config, split).sizes or config.sizes)} for split in SPLITS},
        }

    @classmethod
    def reward_spec(cls, config: MazeEnvConfig) -> dict[str, Any]:
        """What decides rewards and success: the reward terms, `stop_required` and the turn limit."""
        spec = {
            "rewards": config.rewards.model_dump(mode="json"),
            "stop_required": config.stop_required,
            "max_turns": config.max_turns,
        }
        if config.end_when_lost:  # only when on, so the specs (and lineage hashes) of runs without it stay as they were
            spec["end_when_lost"] = True
        return spec

    @classmethod
    def adhoc_task(cls, config: MazeEnvConfig, seed: int) -> Task:
        """A maze outside any split (`vlrl env render/play --seed`): the first of env.sizes, the
        config's layout and placement, the default theme."""
        return adhoc_task(
            config.sizes[0],
            seed,
            env=cls.name,
            placement=config.placement,
            min_distance=config.min_distance,
            layout=config.layout,
        )

    @classmethod
    def describe_task(cls, task: Task) -> dict[str, str]:
        """Columns of `vlrl env split`: variant, start, goal and the shortest path's moves."""
        maze = maze_for_task(task)
        moves = distances_to(maze, maze.goal)[maze.start[0]][maze.start[1]]
        return {
            "variant": str(task.params.get("variant", "-")),
            "start": str(list(maze.start)),
            "goal": str(list(maze.goal)),
            "moves": str(moves),
        }

    @classmethod
    def train_overlap(cls, config: MazeEnvConfig, tasks: list[Task]) -> list[Task]:
        return train_overlap(tasks)

    # -- episode ------------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        """Start the episode of `task`: its maze, the agent on the start cell."""
        return self.start(task, maze_for_task(task))

    def start(self, task: Task, maze: Maze) -> Observation:
        """Start an episode on an explicit maze (used by `reset` and by trace replay)."""
        self.task, self.maze = task, maze
        self.pos = maze.start
        self.dist = distances_to(maze, maze.goal)
        self.turns: list[dict[str, Any]] = []
        self.done = False
        self.success = False
        self.lost = False
        self.episode_return = 0.0
        self.invalid_actions = 0
        self.wall_bumps = 0
        return Observation(self._images(), self._first_text())

    def _first_text(self) -> str:
        return INSTRUCTION if self.config.stop_required else INSTRUCTION_NO_STOP

    def _images(self) -> list:
        if not self.render_images:
            return []
        theme = self.task.params.get("theme", "default")
        noise_seed = self.task.seed if theme == "noise" else None
        return [render(self.maze, self.pos, self.config.cell_px, theme, noise_seed)]

    def _check_started(self, what: str) -> None:
        if self.maze is None:
            raise VlrlError(f"{what}() before reset(task); start an episode first")

    def _check_running(self) -> None:
        self._check_started("step")
        if self.done:
            raise VlrlError("step() on a finished episode; call reset(task) to start a new one")

    def _distance(self) -> int:
        return self.dist[self.pos[0]][self.pos[1]]

    def optimal_turns(self) -> int:
        """Turns of optimal play from the start."""
        d = self.dist[self.maze.start[0]][self.maze.start[1]]
        return d + (1 if self.config.stop_required else 0)

    def _turns_needed(self) -> int:
        """Turns of optimal play from where the agent is now (`stop` included where it is required)."""
        return self._distance() + (1 if self.config.stop_required else 0)

    def render_text(self) -> str:
        """The maze as text with the agent on it, for `vlrl env play` in a terminal."""
        self._check_started("render_text")
        return ascii_maze(self.maze, self.pos)

    def random_response(self, rng) -> str:
        """`<action>X</action>` with a random move: SFT noise, so transcripts show recovering from a bump
        (the plan variant reads it as an invalid answer)."""
        return f"<action>{rng.choice(MOVES)}</action>"

    def episode_metrics(self) -> dict[str, float]:
        """success, turns, invalid_actions, wall_bumps, optimal_turns, return, final_distance, solvable;
        with env.end_when_lost also `lost` (1 where the rule ended the episode: the share of a
        batch it cut short)."""
        self._check_started("episode_metrics")
        lost = {"lost": float(self.lost)} if self.config.end_when_lost else {}
        return {
            "success": float(self.success),
            "turns": float(len(self.turns)),
            "invalid_actions": float(self.invalid_actions),
            "wall_bumps": float(self.wall_bumps),
            "optimal_turns": float(self.optimal_turns()),
            "return": float(self.episode_return),
            "final_distance": float(self._distance()),
            "solvable": float(self.optimal_turns() <= self.config.max_turns),
            **lost,
        }

    def trace(self) -> dict[str, Any]:
        """The episode as JSON (format `vlrl.trace/1`, see docs/maze.md)."""
        self._check_started("trace")
        # The early end is recorded only where it is on: absent (off) in every older trace.
        extra = {"end_when_lost": True} if self.config.end_when_lost else {}
        return episode_trace(self, TRACE_FORMAT, "maze", self.maze.to_json(), extra_settings=extra)

    @classmethod
    def replay_trace(cls, trace: dict[str, Any]) -> dict[str, Any]:
        """Re-run a trace from its maze JSON and raw responses; report whether it matches.

        Returns {"success", "return", "turns", "matches", "problems"}: the replayed outcome, and
        the list of differences from what the trace records (empty when it is consistent).
        """
        return replay_env_trace(cls, trace, TRACE_FORMAT, "maze", Maze.from_json)


@register_env("maze", config=MazeEnvConfig)
class MazeEnv(MazeEpisode):
    """Multi-turn maze: one action per turn, a re-rendered image each turn."""

    system_prompt = SYSTEM_PROMPT

    def step(self, action_text: str) -> StepResult:
        """Apply one response; see the module docstring for the rules."""
        self._check_running()
        cfg = self.config
        action = parse_action(action_text)
        before = self._distance()
        bumped = False
        if action is None:
            feedback = INVALID_FEEDBACK
            self.invalid_actions += 1
        elif action == "stop":
            self.done = True
            self.success = self.pos == self.maze.goal
            feedback = STOP_ON_GOAL_FEEDBACK if self.success else STOP_OFF_GOAL_FEEDBACK
        else:
            moved_to = self.maze.move(self.pos, action)
            if moved_to is None:
                bumped = True
                self.wall_bumps += 1
                feedback = WALL_FEEDBACK[action]
            else:
                self.pos = moved_to
                feedback = MOVED_FEEDBACK[action]
                if not cfg.stop_required and self.pos == self.maze.goal:
                    self.done = self.success = True
                    feedback = REACHED_GOAL_FEEDBACK
        truncated = not self.done and len(self.turns) + 1 >= cfg.max_turns
        if truncated:
            self.done = True
            feedback = f"{feedback} {OUT_OF_TURNS_FEEDBACK}"
        lost = cfg.end_when_lost and not self.done and self._turns_needed() > cfg.max_turns - (len(self.turns) + 1)
        if lost:
            self.done = self.lost = True
            feedback = f"{feedback} {LOST_FEEDBACK}"
        reward = turn_reward(
            cfg.rewards,
            valid=action is not None,
            bumps=int(bumped),
            distance_before=before,
            distance_after=self._distance(),
            success=self.success,
        )
        self.episode_return += reward
        self.turns.append(
            {
                "response": action_text,
                "action": action,
                "valid": action is not None,
                "bumped": bumped,
                "reward": reward,
                "feedback": feedback,
                "position": list(self.pos),
            }
        )
        info = {
            "action": action,
            "valid": action is not None,
            "bumped": bumped,
            "success": self.success,
            "feedback": feedback,
            "position": list(self.pos),
            "distance": self._distance(),
            "turn": len(self.turns),
            "truncated": truncated,
            "lost": lost,
        }
        observation = None if self.done else Observation(self._images(), feedback)
        return StepResult(observation, reward, self.done, info)

    def legal_responses(self) -> list[str]:
        """`<action>X</action>` for each move a wall does not block (what the picture shows around the agent)."""
        self._check_started("legal_responses")
        return [f"<action>{m}</action>" for m in MOVES if self.maze.move(self.pos, m) is not None]

    def format_response(self, text: str) -> str:
        """A typed move as a response: `right` -> `<action>right</action>` (tagged text is kept)."""
        return text if "<action>" in text.lower() else f"<action>{text}</action>"

    def oracle_response(self) -> str:
        """`<action>X</action>` with the move towards the goal, or stop on it."""
        self._check_started("oracle_response")
        return f"<action>{next_action(self.maze, self.pos)}</action>"

    # The imperfect demonstrators of train.sft.demonstrator: envs/maze/walker.py.
    demonstrators = DEMONSTRATORS
    _walker: DfsWalker | None = None  # the started demonstrator of this episode

    def start_demonstrator(self, name: str, rng: random.Random) -> None:
        """Start demonstrator `name` on this episode (after reset); `rng` orders walker_random's moves."""
        self._check_started("start_demonstrator")
        if name not in self.demonstrators:
            raise VlrlError(f"maze has no demonstrator '{name}'; {did_you_mean(name, self.demonstrators)}")
        self._walker = DfsWalker.named(name, self.maze, rng)

    def demonstrator_response(self) -> str:
        """`<action>X</action>` with the demonstrator's move at the agent's position (start_demonstrator first)."""
        walker = self._walker
        if walker is None or walker.maze is not self.maze:
            raise VlrlError("demonstrator_response() before start_demonstrator(name, rng) on this episode")
        return f"<action>{walker.action(self.pos)}</action>"
