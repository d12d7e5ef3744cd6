"""bench/gui_label_blind.py: the chance of a label-blind policy, and the first-click rows of level-2 traces."""

from __future__ import annotations

import gzip
import json

from tests.conftest import ROOT, load_bench
from vlrl.config import load_config
from vlrl.envs.base import build_split, make_env


def test_label_blind_chance_is_the_mean_of_one_over_the_candidates(tmp_path):
    config = tmp_path / "gui.yaml"
    config.write_text((ROOT / "configs" / "gui-cpu.yaml").read_text().replace("count: 400", "count: 12"))
    result = load_bench("gui_label_blind").label_blind_chance(str(config), 2, 128, "holdout")
    assert result["tasks"] == 12 and sum(result["candidates"].values()) == 12
    expected = sum(v / int(k) for k, v in result["candidates"].items()) / 12
    assert abs(result["label_blind_success"] - round(expected, 4)) < 1e-9
    assert set(result["candidates"]) <= {"1", "2", "3", "4"}


def test_first_clicks_counts_the_row_each_episode_clicked_first(tmp_path):
    config = load_config(ROOT / "configs" / "gui-cpu.yaml", ["env.levels=[2]", "env.width=128", "env.height=128"])
    tasks = [build_split(config.env, "holdout")[i] for i in range(3)]
    path = tmp_path / "traces.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i, task in enumerate(tasks):
            env = make_env(config.env)
            env.reset(task)
            # episode 0: the oracle (first click on the target's row); 1: a click on empty space; 2: the oracle
            env.step(env.oracle_response() if i != 1 else "<action>click(1, 1)</action>")
            f.write(json.dumps(env.trace()) + "\n")
    out = load_bench("gui_label_blind").first_clicks(str(path))
    assert out["episodes"] == 3
    assert out["first_click_row"].get("miss") == 1 and sum(out["first_click_row"].values()) == 3
    assert sum(out["target_row"].values()) == 3
    clicked = {row: n for row, n in out["first_click_row"].items() if row != "miss"}
    assert all(n <= out["target_row"].get(row, 0) for row, n in clicked.items())  # the oracle clicks the target's row
