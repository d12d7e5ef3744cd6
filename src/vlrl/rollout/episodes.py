"""The episode driver: many multi-turn episodes at once through one rollout engine.

Each turn, the episodes still running are batched into one engine call; their environments step
on the responses; each conversation grows by the model's tokens (loss mask 1) and by the next
observation (loss mask 0); finished episodes leave the batch. The first turn of the G episodes of
a task is one prompt sampled `n=G` times, so single-turn tasks (the plan variant) cost one prompt
per task.

Each turn also records the state it acted on (`Episode.turn_states`, a digest of the whole
observation: images and text), so GiGPO can compare the turns of a group that faced the same
observation (`vlrl.algo.grpo.step_advantages`). The text is part of it on purpose: in the maze the
turn after a bump sees the same picture with "Cannot move right into a wall.", and it is among such
turns that repeating the bump and trying another way are told apart.

With `exploring_starts` (`algo.exploring_starts`), every legal first move is tried: the first
episodes of each group take the env's legal first moves (`Env.legal_responses`, in an order
shuffled per task), the rest of the group samples as usual. So every group compares each first move
by what followed it, whatever the policy would have chosen (the Monte Carlo "exploring starts" of
Sutton & Barto, 5.3), and the sampled ones still show the policy's own mistakes (a bump, which no
legal move is). The forced responses are not the policy's samples, so they carry no sampling
log-prob (NaN): the update's ratio uses the trainer's own old log-probs, and the sampler/trainer
gap skips them.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from vlrl.envs.base import Env, Observation, Task, make_env
from vlrl.envs.config import EnvConfigBase
from vlrl.errors import VlrlError
from vlrl.rollout.engine import Completion, RolloutEngine, SamplingParams
from vlrl.rollout.sequence import ChatFormat, MultimodalSequence


@dataclass
class Episode:
    """Everything one episode produced: tokens for training, rewards, metrics and a trace."""

    task: Task
    group: int  # index of the task in the batch; the G episodes of a task share it
    sequence: MultimodalSequence
    turn_rewards: list[float] = field(default_factory=list)
    turn_states: list[str] = field(default_factory=list)  # observation_key of what each turn saw
    metrics: dict[str, float] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    adapter_version: int = 0
    truncated: bool = False  # ended because the conversation outgrew rollout.max_model_len
    response_tokens: int = 0

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))


def observation_key(obs: Observation) -> str:
    """A digest of one observation, images (pixels) and text: equal keys, same observation."""
    h = hashlib.blake2b(digest_size=12)
    for image in obs.images:
        h.update(f"{image.mode}{image.size}".encode())
        h.update(image.tobytes())
    h.update(obs.text.encode())
    return h.hexdigest()


@dataclass
class RolloutStats:
    """Where the time went during one call of `run_episodes`."""

    generate_s: float = 0.0
    env_s: float = 0.0
    generated_tokens: int = 0
    engine_calls: int = 0


def run_episodes(
    engine: RolloutEngine,
    chat: ChatFormat,
    env_config: EnvConfigBase,
    tasks: list[Task],
    group_size: int,
    params: SamplingParams,
    max_model_len: int,
    stats: RolloutStats | None = None,
    exploring_starts: bool = False,
) -> list[Episode]:
    """Play `group_size` episodes of every task; returns them grouped task by task."""
    stats = stats if stats is not None else RolloutStats()
    envs: list[Env] = []
    episodes: list[Episode] = []
    t0 = time.perf_counter()
    first_prompts: list[MultimodalSequence] = []
    states: list[str] = []  # per episode: the key of the observation its next turn answers
    for group, task in enumerate(tasks):
        probe = make_env(env_config)
        first = probe.reset(task)
        prompt = chat.prompt(probe.system_prompt, first)
        first_prompts.append(prompt)
        states += [observation_key(first)] * group_size
        for k in range(group_size):
            env = probe if k == 0 else make_env(env_config)
            if k:
                env.reset(task)
            envs.append(env)
            episodes.append(Episode(task, group, prompt.copy(), adapter_version=engine.adapter_version))
    stats.env_s += time.perf_counter() - t0

    # Turn 1: one prompt per task, G samples each; with exploring starts the first ones are replaced.
    turn_params = SamplingParams(**{**params.__dict__, "n": group_size})
    completions = _generate(engine, first_prompts, turn_params, stats)
    if exploring_starts:
        _force_legal_first_moves(chat, envs, completions, random.Random(params.seed))
    responses = [c for per_task in completions for c in per_task]
    active = list(range(len(episodes)))
    turn = 0
    while active:
        turn += 1
        t0 = time.perf_counter()
        still: list[int] = []
        for i, comp in zip(active, responses):
            ep, env = episodes[i], envs[i]
            ep.sequence.append_sampled(comp.token_ids, comp.logprobs)
            ep.response_tokens += len(comp.token_ids)
            ep.turn_states.append(states[i])
            result = env.step(comp.text)
            ep.turn_rewards.append(float(result.reward))
            if result.done:
                continue
            states[i] = observation_key(result.observation)
            piece = chat.observation_piece(
                result.observation,
                response_ended=comp.finish_reason == "stop"
                and bool(comp.token_ids)
                and comp.token_ids[-1] == chat.eos_id,
            )
            if len(ep.sequence) + len(piece) + params.max_new_tokens > max_model_len:
                ep.truncated = True
                continue
            ep.sequence.extend(piece)
            still.append(i)
        stats.env_s += time.perf_counter() - t0
        active = still
        if not active:
            break
        # Later turns: each episode's own conversation, one sample, seeds moved on per turn.
        turn_params = SamplingParams(
            **{**params.__dict__, "n": 1, "seed": None if params.seed is None else params.seed + turn}
        )
        completions = _generate(engine, [episodes[i].sequence for i in active], turn_params, stats)
        responses = [per[0] for per in completions]

    for ep, env in zip(episodes, envs):
        ep.metrics = {
            **env.episode_metrics(),
            "truncated": float(ep.truncated),
            "response_tokens": float(ep.response_tokens),
        }
        ep.trace = env.trace()
        ep.trace["adapter_version"] = ep.adapter_version
    return episodes


def _force_legal_first_moves(
    chat: ChatFormat, envs: list[Env], completions: list[list[Completion]], rng: random.Random
) -> None:
    """Replace the first samples of each task's group by its legal moves, shuffled (as many as fit)."""
    for group, samples in enumerate(completions):
        moves = envs[group * len(samples)].legal_responses()
        if not moves:
            raise VlrlError(f"exploring starts: env '{envs[0].name}' lists no legal first move for this task")
        rng.shuffle(moves)
        for k, move in enumerate(moves[: len(samples)]):
            ids = chat.response_ids(move)
            samples[k] = Completion(ids, [math.nan] * len(ids), move, "stop")


def _generate(
    engine: RolloutEngine, prompts: list[MultimodalSequence], params: SamplingParams, stats: RolloutStats
) -> list[list[Completion]]:
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    stats.generate_s += time.perf_counter() - t0
    stats.engine_calls += 1
    stats.generated_tokens += sum(len(c.token_ids) for per in out for c in per)
    return out
