"""Episode traces, the parts every env shares: writing one (`episode_trace`) and replaying one.

A trace is re-checked from its own content: the env is rebuilt from the trace's settings
(`settings_config`), started on the trace's task content (the env's part), then stepped through the
raw responses the trace records (`replay_responses`), comparing every turn's record, the success
and the return with what the trace says.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from vlrl.envs.base import Task
from vlrl.errors import VlrlError

TRACE_KEYS = ("format", "task", "settings", "turns", "success", "return")


def episode_trace(
    env: Any,
    trace_format: str,
    content_key: str,
    content: dict[str, Any],
    extra_settings: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The trace of `env`'s episode: format, env, task, its content (e.g. "maze": the maze JSON),
    the settings that decide rewards (max_turns, stop_required, rewards, and the env's
    `extra_settings`: the maze's end_when_lost where on), the turns, `extra`, and the outcome
    (done, success, return)."""
    config = env.config
    settings = {
        "max_turns": config.max_turns,
        "stop_required": config.stop_required,
        "rewards": config.rewards.model_dump(),
        **(extra_settings or {}),
    }
    return {
        "format": trace_format,
        "env": env.name,
        "task": env.task.to_json(),
        content_key: content,
        "settings": settings,
        "turns": [dict(t) for t in env.turns],
        **extra,
        "done": env.done,
        "success": env.success,
        "return": env.episode_return,
    }


def replay_env_trace(
    cls: type, trace: dict[str, Any], trace_format: str, content_key: str, read_content
) -> dict[str, Any]:
    """Replay `trace` with env class `cls`: check it, rebuild the config from its settings, start
    `cls.start(task, read_content(trace[content_key]))` (images off) and compare every turn.

    Returns `replay_responses`' report: {"success", "return", "turns", "matches", "problems"}.
    """
    check_trace(trace, trace_format, content_key)
    env = cls(settings_config(cls.config_class, cls.name, trace["settings"]), render_images=False)
    env.start(Task.from_json(trace["task"]), read_content(trace[content_key]))
    return replay_responses(env, trace)


def check_trace(trace: dict[str, Any], trace_format: str, content_key: str) -> None:
    """Raise VlrlError unless the trace has every key (and `content_key`, e.g. "maze") and this format."""
    for key in (*TRACE_KEYS[:2], content_key, *TRACE_KEYS[2:]):
        if key not in trace:
            raise VlrlError(f"trace lacks '{key}'")
    if trace["format"] != trace_format:
        raise VlrlError(f"trace format is {trace['format']!r}; this version reads {trace_format!r}")


def settings_config(config_class: type, name: str, settings: Any):
    """The env config a trace's `settings` (max_turns, stop_required, rewards, and the maze's
    end_when_lost where it was on) describe."""
    try:
        extra = {"end_when_lost": settings["end_when_lost"]} if "end_when_lost" in settings else {}
        return config_class(
            name=name,
            max_turns=settings["max_turns"],
            stop_required=settings["stop_required"],
            rewards=settings["rewards"],
            **extra,
        )
    except (ValidationError, KeyError, TypeError) as exc:
        raise VlrlError(f"trace settings are invalid ({str(exc).splitlines()[0]})") from None


def replay_responses(env: Any, trace: dict[str, Any]) -> dict[str, Any]:
    """Step a started env through the trace's raw responses; report whether it matches.

    Returns {"success", "return", "turns", "matches", "problems"}: the replayed outcome, and the
    list of differences from what the trace records (empty when it is consistent). `env` keeps
    its turn records in `env.turns` and its outcome in `done`, `success`, `episode_return`.
    """
    problems: list[str] = []
    for i, recorded in enumerate(trace["turns"], start=1):
        if env.done:
            problems.append(f"turn {i} is recorded after the episode ended")
            break
        env.step(str(recorded.get("response", "")))
        for key, value in env.turns[-1].items():
            want = recorded.get(key)
            same = (
                abs(float(want) - value) < 1e-9 if key == "reward" and isinstance(want, (int, float)) else want == value
            )
            if not same:
                problems.append(f"turn {i}: {key} is {want!r} in the trace but {value!r} on replay")
    if env.success != trace["success"]:
        problems.append(f"success is {trace['success']!r} in the trace but {env.success!r} on replay")
    if not isinstance(trace["return"], (int, float)) or abs(trace["return"] - env.episode_return) > 1e-9:
        problems.append(f"return is {trace['return']!r} in the trace but {env.episode_return!r} on replay")
    return {
        "success": env.success,
        "return": env.episode_return,
        "turns": len(env.turns),
        "matches": not problems,
        "problems": problems,
    }
