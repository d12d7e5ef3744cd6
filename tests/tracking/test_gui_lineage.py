"""Lineage and the registry, unchanged, for a gui run: the gui env's own data facts and reward
settings are recorded, and its adapters go to a registered model named after the gui env
(real MLflow on SQLite)."""

from __future__ import annotations

from pathlib import Path

from tracking_helpers import make_adapter

from vlrl.config import load_config
from vlrl.envs.base import SPLITS, split_version
from vlrl.envs.gui.env import GuiEnv
from vlrl.envs.gui.generate import GENERATOR_VERSION
from vlrl.envs.gui.splits import SPLIT_RULE
from vlrl.models.fingerprint import model_fingerprint
from vlrl.tracking import collect_lineage
from vlrl.tracking.lineage import canonical_hash
from vlrl.tracking.registry import AdapterRegistry, model_name_for

ROOT = Path(__file__).resolve().parents[2]


def test_a_gui_runs_lineage_and_registered_model_come_from_the_gui_env(ci_model_dir, reg_config, tmp_path):
    gui = load_config(
        ROOT / "configs" / "gui-cpu.yaml",
        [f"model.path={ci_model_dir}", f"storage.root={tmp_path / 'runs'}", "runtime.backend=local"],
    )
    lineage = collect_lineage(gui, tmp_path / "runs" / "gui-run")

    data = lineage["data"]
    assert (data["env"], data["generator_version"], data["split_rule"]) == ("gui", GENERATOR_VERSION, SPLIT_RULE)
    assert (data["levels"], data["screen"], data["distractors"], data["theme"]) == ([1], [96, 96], [2, 4], "light")
    for name in SPLITS:
        split = getattr(gui.env, name)
        assert data["splits"][name] == {
            "seed_start": split.seed_start,
            "seed_end": split.seed_start + split.count,
            "count": split.count,
            "version": split_version(gui.env, name),
        }, name
    assert (
        data["splits"]["holdout"]["seed_start"] == 10000000 and data["splits"]["holdout"]["count"] == 400
    )  # configs/gui-cpu.yaml
    spec = {"env": "gui", **GuiEnv.reward_spec(gui.env)}
    assert spec["rewards"]["misclick"] == -0.05 and spec["stop_required"] is False and spec["max_turns"] == 2
    assert lineage["rewards"] == {**spec, "hash": canonical_hash(spec)}

    # the registry names the model after the env in the adapter's lineage: a gui adapter and a
    # maze adapter on the same base model become two registered models
    registry = AdapterRegistry.from_config(gui, create=True)
    base = model_fingerprint(ci_model_dir)
    gui_out = registry.register(make_adapter(gui, tmp_path / "runs" / "gui-run" / "adapter", seed=1))
    maze = reg_config()
    maze_out = registry.register(make_adapter(maze, tmp_path / "runs" / "maze-run" / "adapter", seed=2))
    assert gui_out["name"] == model_name_for(gui.registry.model_name, "gui", base) == f"gui-{base.split(':')[1][:12]}"
    assert maze_out["name"] == model_name_for(maze.registry.model_name, "maze", base) != gui_out["name"]
    assert (gui_out["version"], maze_out["version"]) == (1, 1)
    model = registry.client.get_registered_model(gui_out["name"])
    assert model.tags["env"] == "gui" and model.tags["base_fingerprint"] == base
    tags = registry.show(gui_out["name"], "candidate")["tags"]
    assert tags["reward_hash"] == lineage["rewards"]["hash"]
    assert (
        tags["split.train.version"] == data["splits"]["train"]["version"]
        and tags["split.holdout.seeds"] == "[10000000,10000400)"
    )
    maze_tags = registry.show(maze_out["name"], "candidate")["tags"]
    assert (
        maze_tags["split.train.version"] != tags["split.train.version"]
        and maze_tags["reward_hash"] != tags["reward_hash"]
    )
