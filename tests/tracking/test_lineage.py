"""Lineage and MLflow tracking, on a short real GRPO run and real MLflow (SQLite)."""

from __future__ import annotations

import json
import math
import shutil

from tracking_helpers import copy_db, make_adapter
from typer.testing import CliRunner

from vlrl.cli import app
from vlrl.envs.base import split_version
from vlrl.models.fingerprint import model_fingerprint
from vlrl.tracking import RunTracker, collect_lineage, finish_lineage, read_lineage, resolve_lineage
from vlrl.tracking.lineage import adapter_fingerprint, git_state, reward_lineage
from vlrl.tracking.store import mlflow_client
from vlrl.tracking.tracker import MAX_PARAM_VALUE, flatten_params, metric_name, numeric_metrics

runner = CliRunner()


def test_lineage_of_an_adapter_from_a_short_real_training_run(tracked_run, ci_model_dir):
    run = tracked_run
    cfg = run.config
    start = json.loads(run.start_lineage)
    assert start["status"] == "running" and start["tracking"]["run_id"] == run.run_id
    lin = read_lineage(run.run_dir)
    # code: this checkout's commit, whether it is dirty (with the diff's hash), the image
    git = lin["code"]["git"]
    assert len(git["commit"]) == 40 and isinstance(git["dirty"], bool) and git["diff_sha256"].startswith("sha256:")
    assert lin["code"]["image"] == "vlrl:test-image" and lin["code"]["vlrl_version"]
    assert {"torch", "transformers", "peft", "ray"} <= set(lin["environment"]["libraries"])
    assert lin["environment"]["python"] and lin["hardware"]["cpu_count"] >= 1 and lin["hardware"]["memory_bytes"] > 0
    # model, data, rewards, config
    assert lin["model"]["fingerprint"] == model_fingerprint(ci_model_dir)
    for split in ("train", "holdout", "adversarial"):
        s = lin["data"]["splits"][split]
        assert s["version"] == split_version(cfg.env, split)
        assert s["seed_end"] - s["seed_start"] == getattr(cfg.env, split).count
    assert lin["data"]["generator_version"] and lin["data"]["split_rule"]
    assert lin["rewards"]["hash"] == reward_lineage(cfg.env)["hash"]
    assert lin["config"] == cfg.model_dump(mode="json")
    # the end: status, checkpoints, evaluations, the adapter and its copy of the lineage
    assert lin["status"] == "finished" and lin["run"]["ended_at"]
    assert [c["step"] for c in lin["checkpoints"]] == [1, 2]
    assert lin["evaluations"][-1]["step"] == 2 and lin["evaluations"][-1]["split"] == "holdout"
    assert lin["adapter"]["fingerprint"] == adapter_fingerprint(run.adapter)
    assert lin["adapter"]["base_fingerprint"] == lin["model"]["fingerprint"]
    copy = read_lineage(run.adapter)
    assert copy["run"]["dir"] == str(run.run_dir.resolve()) and copy["tracking"]["run_id"] == run.run_id

    # MLflow: params, per-step metrics, the evaluation, artifacts, lineage tags, status
    client = mlflow_client(f"sqlite:///{run.db}")
    mlrun = client.get_run(run.run_id)
    assert mlrun.info.status == "FINISHED"
    assert mlrun.data.params["algo.group_size"] == str(cfg.algo.group_size)
    assert mlrun.data.params["env.sizes"] == "[3]"
    assert [m.step for m in client.get_metric_history(run.run_id, "reward/mean")] == run.steps == [1, 2]
    assert mlrun.data.metrics["eval/holdout/n"] == 2
    assert mlrun.data.tags["vlrl.git_commit"] == git["commit"]
    assert mlrun.data.tags["vlrl.base_fingerprint"] == lin["model"]["fingerprint"]
    assert mlrun.data.tags["vlrl.adapter_fingerprint"] == lin["adapter"]["fingerprint"]
    top = {a.path for a in client.list_artifacts(run.run_id)}
    assert {"adapter", "lineage", "run", "evals"} <= top
    assert {a.path for a in client.list_artifacts(run.run_id, "adapter")} >= {"adapter/adapter_model.safetensors"}
    assert {a.path for a in client.list_artifacts(run.run_id, "run")} >= {"run/config.yaml", "run/metrics.jsonl"}

    # `vlrl lineage ADAPTER` prints the chain adapter -> run -> code/config/model/data -> evaluations
    out = runner.invoke(app, ["lineage", str(run.adapter)])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    for piece in (
        "adapter",
        "files unchanged",
        "run",
        run.run_id,
        git["commit"][:12],
        "vlrl:test-image",
        lin["model"]["fingerprint"][:19],
        "holdout: seeds [10000000, 10000032)",
        "step-000002",
        "step 2 holdout",
    ):
        assert piece in text, piece
    as_json = runner.invoke(app, ["lineage", str(run.run_dir), "--json"])
    assert json.loads(as_json.output)["lineage"]["tracking"]["run_id"] == run.run_id


def test_the_chain_follows_the_adapter_a_run_started_from(reg_config, tmp_path):
    cfg = reg_config()
    sft = make_adapter(cfg, tmp_path / "sft-run" / "adapter", seed=1)
    run_dir = tmp_path / "grpo-run"
    lineage = collect_lineage(cfg, run_dir, init_adapter=str(sft))
    grpo = make_adapter(cfg, run_dir / "adapter", seed=2)
    finish_lineage(lineage, run_dir, adapter_dir=grpo)
    chain = resolve_lineage(grpo)
    assert chain["adapter"]["files"] == "unchanged"
    assert chain["lineage"]["model"]["init_adapter"]["fingerprint"] == adapter_fingerprint(sft)
    assert chain["parent"]["adapter"]["path"] == str(sft.resolve())
    out = runner.invoke(app, ["lineage", str(grpo)])
    assert "started from adapter" in out.output and str(tmp_path / "sft-run") in " ".join(out.output.split())

    # an adapter whose files changed after its run saved it is flagged
    moved = tmp_path / "copy" / "adapter"
    shutil.copytree(grpo, moved)
    (moved / "adapter_config.json").write_text((moved / "adapter_config.json").read_text().replace('"r": 8', '"r": 9'))
    assert resolve_lineage(moved)["adapter"]["files"].startswith("CHANGED")


def test_a_resumed_run_continues_its_mlflow_run_and_keeps_earlier_attempts(tracked_run, reg_config, tmp_path):
    db = copy_db(tracked_run.db, tmp_path / "store")
    cfg = reg_config("tracking.enabled=true", f"tracking.uri={db}")
    run_dir = tmp_path / "runs" / "resumed"
    first = RunTracker.from_config(cfg)
    run_id = first.start(cfg, run_dir, collect_lineage(cfg, run_dir))
    first.end("KILLED")
    second = RunTracker.from_config(cfg)
    assert second.start(cfg, run_dir, collect_lineage(cfg, run_dir)) == run_id
    client = mlflow_client(f"sqlite:///{db}")
    assert client.get_run(run_id).info.status == "RUNNING"
    second.log_step(3, {"step": 3, "reward/mean": 0.5, "bad name!": 1.0, "nan": math.nan, "text": "x"})
    done = second.end("FINISHED")
    assert done["attempts"][0]["status"] == "killed" and done["status"] == "finished"
    assert client.get_run(run_id).info.status == "FINISHED"
    assert set(client.get_run(run_id).data.metrics) == {"reward/mean", "bad name_"}


def test_disabled_tracking_writes_lineage_only(reg_config, tmp_path):
    cfg = reg_config()
    tracker = RunTracker.from_config(cfg)
    assert (
        not tracker.enabled
        and tracker.start(cfg, tmp_path / "runs" / "r", collect_lineage(cfg, tmp_path / "runs" / "r")) is None
    )
    tracker.log_step(1, {"reward/mean": 1.0})
    assert tracker.end("FINISHED")["status"] == "finished"
    assert read_lineage(tmp_path / "runs" / "r")["status"] == "finished"
    assert not (tmp_path / "runs" / "mlflow.db").exists()


def test_params_and_metric_names_fit_mlflow_limits(tmp_path):
    params = flatten_params({"a": {"b": 1, "c": [1, 2], "d": None}, "long": "x" * 10_000})
    assert params["a.b"] == "1" and params["a.c"] == "[1, 2]" and params["a.d"] == "null"
    assert len(params["long"]) == MAX_PARAM_VALUE and params["long"].endswith("...")
    assert metric_name("eval/holdout/success_by_group/9x9") == "eval/holdout/success_by_group/9x9"
    assert metric_name("a:b@c") == "a_b_c"
    assert numeric_metrics({"x": 1, "y": math.inf, "z": {"w": 2.5}, "s": "no"}) == {"x": 1.0, "z/w": 2.5}
    assert git_state(tmp_path) is None  # not a git checkout: the lineage leaves git out
