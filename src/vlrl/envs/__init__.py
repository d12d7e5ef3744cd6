"""Environments: the env API (`vlrl.envs.base`) and the built-in envs: the image maze (`vlrl.envs.maze`)
and GUI control from screenshots (`vlrl.envs.gui`)."""

from vlrl.envs.base import (
    SPLITS,
    Env,
    Observation,
    StepResult,
    Task,
    build_split,
    make_env,
    overlapping_tasks,
    register_env,
    registered_envs,
    replay_trace,
    split_version,
    step_all,
    task_content_hash,
)

__all__ = [
    "SPLITS",
    "Env",
    "Observation",
    "StepResult",
    "Task",
    "build_split",
    "make_env",
    "overlapping_tasks",
    "register_env",
    "registered_envs",
    "replay_trace",
    "split_version",
    "step_all",
    "task_content_hash",
]
