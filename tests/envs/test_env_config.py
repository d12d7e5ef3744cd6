"""Env-owned configs: `RunConfig.env` is validated by the config class its `name` registers."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Literal

import pytest
from pydantic import Field
from typer.testing import CliRunner

from vlrl.cli import app
from vlrl.config import RunConfig, config_to_yaml, describe_fields, load_config
from vlrl.envs.base import (
    Env,
    Observation,
    StepResult,
    Task,
    register_env,
    registered_envs,
    task_group,
    task_group_label,
)
from vlrl.envs.config import EnvConfigBase
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.errors import ConfigError, VlrlError


class CounterConfig(EnvConfigBase):
    name: Literal["toy_counter"] = Field("toy_counter", description="The counting toy env.")
    target: int = Field(3, ge=1, description="Count to reach.")
    levels: list[int] = Field(default_factory=lambda: [1, 2], description="Levels tasks cycle through.")


@register_env("toy_counter", config=CounterConfig)
class CounterEnv(Env):
    """Say `more` until the count reaches `target` (times the task's level), then `done`."""

    system_prompt = "Count."
    task_group_label = "level"

    def __init__(self, config: CounterConfig):
        self.config = config

    @classmethod
    def build_split(cls, config: CounterConfig, split: str) -> list[Task]:
        seeds = getattr(config, split)
        return [
            Task("toy_counter", split, i, seeds.seed_start + i, {"level": config.levels[i % len(config.levels)]})
            for i in range(seeds.count)
        ]

    @classmethod
    def split_version(cls, config: CounterConfig, split: str) -> str:
        return f"{config.target:012d}"

    @classmethod
    def content_hash(cls, task: Task) -> str:
        return str(task.params["level"])

    @classmethod
    def task_group(cls, task: Task) -> str:
        return f"level {task.params['level']}"

    def reset(self, task: Task) -> Observation:
        self.task, self.count, self.turns, self.success = task, 0, 0, False
        return Observation([], "count")

    def step(self, action_text: str) -> StepResult:
        self.turns += 1
        goal = self.config.target * self.task.params["level"]
        if "done" in action_text:
            self.success = self.count == goal
            return StepResult(None, float(self.success), True)
        self.count += 1
        return StepResult(Observation([], str(self.count)), 0.0, self.turns >= self.config.max_turns)

    def episode_metrics(self) -> dict[str, float]:
        return {"success": float(self.success), "turns": float(self.turns)}

    def trace(self) -> dict[str, Any]:
        return {"env": "toy_counter", "task": self.task.to_json()}

    def oracle_response(self) -> str:
        return "done" if self.count == self.config.target * self.task.params["level"] else "more"

    @classmethod
    def replay_trace(cls, trace: dict[str, Any]) -> dict[str, Any]:
        return {"matches": False, "problems": ["the toy env's traces record no responses"]}


def _load(tmp_path, text: str, *overrides: str) -> RunConfig:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    return load_config(f, list(overrides))


def test_a_registered_env_brings_its_own_config(tmp_path):
    cfg = _load(tmp_path, "env:\n  name: toy_counter\n  target: 5\n  holdout: {seed_start: 500000, count: 4}\n")
    assert type(cfg.env) is CounterConfig and cfg.env.target == 5 and cfg.env.levels == [1, 2]
    assert cfg.env.holdout.count == 4 and cfg.env.train.count == 100_000  # partial sections keep defaults
    assert load_config(None, ["env.name=toy_counter", "env.target=2"]).env.target == 2
    # the YAML of the resolved config names the env's own fields and reads back equal
    text = config_to_yaml(cfg)
    assert "target: 5" in text and "sizes" not in text
    again = tmp_path / "again.yaml"
    again.write_text(text)
    assert load_config(again) == cfg
    # the generic API works on it without any edit outside this file
    tasks = CounterEnv.build_split(cfg.env, "holdout")
    assert [task_group(t) for t in tasks] == ["level 1", "level 2", "level 1", "level 2"]
    assert task_group_label("toy_counter") == "level" and task_group_label("maze") == "maze size"


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("env:\n  sizez: [5]\n", "unknown key 'env.sizez'; did you mean 'env.sizes'?"),
        ("env:\n  name: maze_plan\n  layot: blocks\n", "unknown key 'env.layot'; did you mean 'env.layout'?"),
        ("env:\n  name: toy_counter\n  targt: 4\n", "unknown key 'env.targt'; did you mean 'env.target'?"),
        ("env:\n  name: toy_counter\n  sizes: [5]\n", "unknown key 'env.sizes'; known keys: name, max_turns"),
        (
            "env:\n  name: toy_countr\n",
            "env.name = 'toy_countr': unknown environment 'toy_countr'; did you mean 'toy_counter'?",
        ),
        ("env:\n  name: toy_counter\n  target: 0\n", "env.target = 0"),
        ("env:\n  name: toy_counter\n  holdout: {seed_start: 5}\n", "overlap"),
        ("env:\n  holdout: {sizez: [5]}\n", "unknown key 'env.holdout.sizez'; did you mean 'env.holdout.sizes'?"),
    ],
)
def test_env_errors_are_one_line_with_that_envs_did_you_mean(tmp_path, yaml_text, expected):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, yaml_text)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_run_config_built_in_python_dispatches_too():
    assert type(RunConfig().env) is MazeEnvConfig and RunConfig().env.name == "maze"
    assert type(RunConfig(env={"name": "toy_counter"}).env) is CounterConfig
    assert RunConfig(env=CounterConfig(target=7)).env.target == 7
    assert type(RunConfig(env={"sizes": [7]}).env) is MazeEnvConfig  # no name: the default env


def test_register_env_checks_the_config_class():
    with pytest.raises(VlrlError, match="needs config="):
        register_env("toy_no_config")(type("NoConfig", (Env,), {}))
    with pytest.raises(VlrlError, match="must build from defaults with name 'toy_other'"):
        register_env("toy_other", config=CounterConfig)(type("Other", (Env,), {}))
    with pytest.raises(VlrlError, match="must be a subclass of vlrl.envs.base.Env"):
        register_env("toy_plain", config=CounterConfig)(type("Plain", (), {}))
    assert "toy_no_config" not in registered_envs() and "toy_other" not in registered_envs()


def test_every_env_field_is_documented_and_shown(tmp_path):
    for name in registered_envs():
        rows = describe_fields(env=name)
        undocumented = [key for key, _, _, doc in rows if not doc.strip()]
        assert not undocumented, (name, undocumented)
    keys = {key for key, *_ in describe_fields(env="toy_counter")}
    assert {"env.target", "env.levels", "env.holdout.seed_start"} <= keys and "env.sizes" not in keys
    assert "env.sizes" in {key for key, *_ in describe_fields()}
    runner = CliRunner()
    shown = runner.invoke(app, ["config", "show", "--doc", "--env", "toy_counter"], terminal_width=300)
    assert shown.exit_code == 0 and "env.target" in shown.output and "env.sizes" not in shown.output
    toy = tmp_path / "toy.yaml"
    toy.write_text("env: {name: toy_counter}\n")
    of_file = runner.invoke(app, ["config", "show", "--doc", str(toy)], terminal_width=300)
    assert of_file.exit_code == 0 and "env.levels" in of_file.output and "env.sizes" not in of_file.output
    bad = runner.invoke(app, ["config", "show", "--doc", "--env", "toy_countr"])
    assert bad.exit_code != 0 and "did you mean 'toy_counter'" in str(bad.exception)


def test_run_config_and_env_modules_do_not_import_each_other():
    code = "import sys, vlrl.envs.base, vlrl.envs.config, vlrl.envs.maze; print('vlrl.config' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_the_env_commands_and_eval_tables_work_for_the_toy_env():
    from vlrl.cli.env_cmd import app as env_app
    from vlrl.eval.evaluate import EvalResult, episode_row, group_table, results_table

    runner = CliRunner()
    listed = runner.invoke(
        env_app, ["split", "--env", "toy_counter", "--show", "3", "env.target=2"], terminal_width=200
    )
    assert listed.exit_code == 0 and "200 tasks" in listed.output and "level 2" in listed.output, listed.output
    played = runner.invoke(env_app, ["play", "--env", "toy_counter", "--oracle", "env.target=2"])
    assert played.exit_code == 0 and played.output.count("oracle> more") == 2 and "success: turns 3" in played.output, (
        played.output
    )
    no_seed = runner.invoke(env_app, ["render", "--env", "toy_counter", "--seed", "1"])
    assert no_seed.exit_code != 0 and "makes no ad-hoc tasks" in str(no_seed.exception)
    # per-level evaluation tables, titled by the env's label
    tasks = CounterEnv.build_split(CounterConfig(), "holdout")[:5]
    result = EvalResult("toy", "holdout", "greedy", [episode_row({"success": float(t.index < 2)}, t) for t in tasks])
    summary = result.summary()
    assert summary["group_label"] == "level" and list(summary["by_group"]) == ["level 1", "level 2"]
    assert summary["by_group"]["level 1"]["n"] == 3 and summary["success_by_group"]["level 2"] == 0.5
    table = group_table([result])
    assert table.title == "per level" and [c.header for c in table.columns][2] == "level"
    assert results_table([result]).columns[-1].header == "by level"


def test_sft_transcripts_come_from_the_toy_envs_oracle(ci_model_dir, tmp_path):
    import random

    from vlrl.models.processor import load_processor
    from vlrl.rollout.sequence import ChatFormat
    from vlrl.training.sft import oracle_transcript, run_sft

    cfg = load_config(None, ["env.name=toy_counter", "env.target=2"])
    chat = ChatFormat(load_processor(ci_model_dir))
    task = CounterEnv.build_split(cfg.env, "train")[0]
    seq = oracle_transcript(cfg, chat, task, random.Random(0))
    learned = chat.tokenizer.decode([t for t, m in zip(seq.token_ids, seq.loss_mask) if m])
    assert learned.replace(chat.tokenizer.decode([chat.eos_id]), " ").split() == ["more", "more", "done"]
    # noise needs the env's random responses: refused in one line before anything is written
    noisy = load_config(None, ["env.name=toy_counter", "train.sft.noise=0.5", f"model.path={ci_model_dir}"])
    with pytest.raises(VlrlError, match="needs env 'toy_counter' to give random responses"):
        run_sft(noisy, tmp_path / "sft")
    assert not (tmp_path / "sft").exists()


def test_a_plugin_registers_through_the_vlrl_envs_entry_point(tmp_path):
    """An installed package's `vlrl.envs` entry point is loaded on the first registry lookup."""
    import os

    (tmp_path / "plug_env.py").write_text(
        "from typing import Literal\nfrom vlrl.envs.base import Env, register_env\n"
        "from vlrl.envs.config import EnvConfigBase\nclass PlugConfig(EnvConfigBase):\n"
        "    name: Literal['plug'] = 'plug'\n    level: int = 1\n@register_env('plug', config=PlugConfig)\n"
        "class PlugEnv(Env):\n    pass\n"
    )
    dist = tmp_path / "plug_env-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plug-env\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[vlrl.envs]\nplug = plug_env\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    code = (
        "from vlrl.config import load_config; c = load_config(None, ['env.name=plug', 'env.level=3']); "
        "print(type(c.env).__name__, c.env.level)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.stdout.strip() == "PlugConfig 3", run.stderr
    (tmp_path / "plug_env.py").write_text("raise RuntimeError('broken plug-in')\n")
    code = (
        "from vlrl.envs.base import registered_envs\ntry:\n    registered_envs()\nexcept Exception as exc:\n    "
        "print(exc)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.stdout.strip() == "env plug-in 'plug' (plug_env) failed to load: broken plug-in", run.stderr


def test_an_env_without_task_groups_is_one_group():
    class FlatConfig(EnvConfigBase):
        name: Literal["toy_flat"] = Field("toy_flat", description="An env without task groups.")

    @register_env("toy_flat", config=FlatConfig)
    class FlatEnv(Env):
        pass

    task = Task("toy_flat", "holdout", 0, 0, {})
    assert task_group(task) == "all" and task_group_label("toy_flat") == "group"
