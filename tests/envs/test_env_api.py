"""The env-agnostic API: Task, Observation, registry, step_all."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from vlrl.envs import Observation, Task, build_split, make_env, registered_envs, split_version, step_all
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.errors import VlrlError


def test_task_json_round_trip_and_hash():
    task = Task("maze", "holdout", 17, 10000017, {"size": 5, "theme": "dark"})
    assert task.task_id == "maze/holdout/17/s10000017"
    again = Task.from_json(task.to_json())
    assert again == task and hash(again) == hash(task)
    assert len({task, again}) == 1
    # params are copied: mutating the caller's dict does not change the task
    params = {"size": 5}
    t = Task("maze", "train", 0, 0, params)
    params["size"] = 7
    assert t.params["size"] == 5


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"env": "maze"},
        {"env": "maze", "split": "train", "index": "0", "seed": 0, "params": {}},
        {"env": "maze", "split": "train", "index": 0, "seed": 0, "params": {}, "x": 1},
    ],
)
def test_task_from_json_rejects_malformed(bad):
    with pytest.raises(VlrlError):
        Task.from_json(bad)


def test_task_params_must_be_json():
    with pytest.raises(VlrlError, match="JSON"):
        Task("maze", "train", 0, 0, {"x": object()})


def test_observation_content_formats():
    image = Image.new("RGB", (8, 8), (255, 0, 0))
    obs = Observation([image], "hello")
    pil = obs.to_content()
    assert pil == [{"type": "image", "image": image}, {"type": "text", "text": "hello"}]
    url = obs.to_content("data_url")
    assert url[1] == {"type": "text", "text": "hello"}
    prefix = "data:image/png;base64,"
    data = url[0]["image_url"]["url"]
    assert url[0]["type"] == "image_url" and data.startswith(prefix)
    decoded = Image.open(io.BytesIO(base64.b64decode(data[len(prefix) :])))
    assert decoded.size == (8, 8) and decoded.convert("RGB").getpixel((0, 0)) == (255, 0, 0)
    with pytest.raises(VlrlError):
        obs.to_content("jpeg")


def test_registry_and_dispatch():
    assert {"maze", "maze_plan"} <= set(registered_envs())
    for name in ("maze", "maze_plan"):
        cfg = MazeEnvConfig(name=name)
        env = make_env(cfg)
        assert env.name == name and env.system_prompt
        assert len(build_split(cfg, "holdout")) == cfg.holdout.count
        assert len(split_version(cfg, "train")) == 12
    with pytest.raises(VlrlError, match="unknown split"):
        build_split(MazeEnvConfig(), "test")


def test_step_all_steps_each_env():
    cfg = MazeEnvConfig()
    tasks = build_split(cfg, "holdout")[:3]
    envs = [make_env(cfg) for _ in tasks]
    for env, task in zip(envs, tasks):
        env.reset(task)
    results = step_all(envs, ["<action>stop</action>", "junk", "<action>stop</action>"])
    assert [r.done for r in results] == [True, False, True]
    assert results[1].info["valid"] is False
    with pytest.raises(VlrlError):
        step_all(envs, ["a"])
