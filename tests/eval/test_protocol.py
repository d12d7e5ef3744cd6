"""The evaluation protocol on the tiny model: tables, traces that re-verify, the train-overlap guard."""

from __future__ import annotations

import json

import pytest

from vlrl.envs.base import Task, build_split, replay_trace
from vlrl.errors import VlrlError
from vlrl.eval.evaluate import results_table
from vlrl.eval.protocol import check_disjoint_from_train, evaluate_models


def test_evaluation_saves_traces_that_reverify_the_success_rate(ci_config, tmp_path):
    cfg = ci_config()
    results = evaluate_models(cfg, [("base", None, None)], split="holdout", limit=6, out_dir=tmp_path / "eval")
    summary = results[0].summary()
    assert summary["n"] == 6 and summary["decoding"] == "greedy"
    traces = [json.loads(line) for line in (tmp_path / "eval" / "base" / "traces.jsonl").read_text().splitlines()]
    replays = [replay_trace(t) for t in traces]
    assert all(r["matches"] for r in replays)
    assert sum(r["success"] for r in replays) / len(replays) == summary["success_rate"]
    assert "base" in str(results_table(results).columns[0]._cells)


def test_holdout_never_overlaps_train_and_a_planted_overlap_is_caught(ci_config):
    cfg = ci_config()
    holdout = list(build_split(cfg.env, "holdout"))
    check_disjoint_from_train(cfg, holdout)
    train_task = build_split(cfg.env, "train")[3]
    planted = Task(train_task.env, "holdout", 999, train_task.seed, dict(train_task.params))
    with pytest.raises(VlrlError, match="also appear in the training split"):
        check_disjoint_from_train(cfg, holdout + [planted])


def test_bad_split_and_missing_adapter_are_clear_errors(ci_config, tmp_path):
    cfg = ci_config()
    with pytest.raises(VlrlError, match="unknown split"):
        evaluate_models(cfg, [("base", None, None)], split="test")
    with pytest.raises(VlrlError, match="is not a directory"):
        evaluate_models(cfg, [("x", None, str(tmp_path / "nope"))], split="holdout", limit=2)
