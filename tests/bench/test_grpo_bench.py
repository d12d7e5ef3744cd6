"""The GRPO benchmark harness (bench/grpo_bench.py, `vlrl bench`) on CPU with the tiny model."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest
from typer.testing import CliRunner

from vlrl.cli import app
from vlrl.cli.bench_cmd import load_harness

TINY = [
    "--model",
    "ci",
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--prompts",
    "2",
    "--samples",
    "2",
    "--new-tokens",
    "4",
    "--cell-px",
    "16",
    "--maze-size",
    "3",
    "--micro-batch",
    "2",
    "--warmup",
    "0",
    "--steps",
    "1",
]


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory):
    from vlrl.training.trainer import GRPOTrainer

    out = tmp_path_factory.mktemp("bench") / "bench.json"
    calls = []
    step = GRPOTrainer.step

    def counted(self):
        calls.append(self.config.rollout.engine)
        return step(self)

    with pytest.MonkeyPatch.context() as mp:  # the bench must run the product's step, not a copy of it
        mp.setattr(GRPOTrainer, "step", counted)
        r = CliRunner().invoke(app, ["bench", *TINY, "--fast-decode", "on", "--decode-sweep", "4", "-o", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text()), r.output, calls


def test_vlrl_bench_times_the_trainers_step_and_writes_json(tiny_result):
    result, output, calls = tiny_result
    assert calls == ["transformers"]  # --warmup 0 --steps 1: one GRPOTrainer.step
    assert "s / step" in output and "update tok/s" in output and "decode" in output and "MFU = " in output
    ours = result["vlrl"]
    assert ours["engine_path"] == "static-cache decoder, eager"
    (step,) = ours["steps"]
    (record,) = ours["records"]
    assert step["step_s"] == record["time/step_s"] and step["sync_s"] == record["time/sync_s"]  # the trainer's own
    assert step["generated_tokens"] == 2 * 2 * 4  # the length is forced
    assert step["step_s"] >= step["rollout_s"] + step["update_s"] > 0
    assert step["update_s"] >= step["old_logprobs_s"] + step["train_s"] > 0
    summary = ours["summary"]
    assert summary["completions_per_s"] == pytest.approx(4 / summary["step_s"])
    assert summary["logprob_diff_mean"] < 1e-4  # the engine samples what the policy scores
    assert ours["decode_sweep"]["4"]["tokens"] == 16
    assert ours["trainable_parameters"] > 0
    n, tokens = ours["forward_parameters"], step["train_tokens"]
    assert summary["update_flops"] == pytest.approx(6 * n * tokens)  # one epoch, on-policy, no KL: 6 N T
    assert summary["update_mfu"] == pytest.approx(6 * n * tokens / summary["update_s"] / 790e12)
    # The update probes, each one more update of the same episodes through the worker.
    probes = ours["update_probes"]
    assert {"recompute", "lora_compute_float32", "compiled_blocks", "profile"} <= set(probes)
    assert probes["recompute"]["update_s"] > 0 and probes["lora_compute_float32"]["update_s"] > 0
    assert ours["compiled_blocks"] is False  # CPU: train.compile_blocks=auto runs eager, the probe compiles
    compiled = probes["compiled_blocks"]
    assert "error" not in compiled and compiled["first_s"] > 0 and compiled["update_s"] > 0, compiled
    assert "model.lora.compute_dtype=float32" in output and "update with compiled blocks" in output


def test_update_flops_count_scoring_passes():
    harness = load_harness()
    flops, formula = harness.update_flop_count(1000, 10, ppo_epochs=2, scoring_passes=2)
    assert flops == (12 + 4) * 1000 * 10 and "6 x ppo_epochs + 2 x scoring_passes" in formula


def test_trl_variants():
    harness = load_harness()
    settings = harness.BenchSettings
    assert harness.trl_variants(settings(compare=["trl", "trl-vllm"])) == ["trl", "trl-vllm"]
    assert harness.trl_variants(settings(trl_only=True, trl_vllm=True)) == ["trl-vllm"]  # the older flags
    assert harness.trl_variants(settings()) == []


def test_merge_combines_side_by_side_runs_of_one_workload(tiny_result):
    harness = load_harness()
    ours, _, _ = tiny_result
    step_s = ours["vlrl"]["summary"]["step_s"]
    trl_only = {key: value for key, value in ours.items() if key != "vlrl"}
    trl_only["trl"] = {"version": "x", "summary": {"step_s": 3 * step_s}, "memory": {}}
    # A TRL + vLLM file as --trl-only --trl-vllm wrote it before the split (under "trl"): read as trl_vllm.
    trl_vllm_only = {
        **trl_only,
        "trl": {
            "version": "x + vLLM colocate",
            "summary": {"step_s": 2 * step_s},
            "memory": {"peak_allocated_gib": 9.0, "device_peak_used_gib": 10.0},
        },
    }
    merged = harness.merge(ours, trl_only, trl_vllm_only)
    assert merged["trl_over_vlrl_step_time"] == pytest.approx(3.0)
    assert merged["trl_vllm_over_vlrl_step_time"] == pytest.approx(2.0)
    table = harness.format_table(merged)
    assert "TRL step time / vlrl step time: 3.00x" in table and "TRL+vLLM step time / vlrl step time: 2.00x" in table
    figures = harness.headline(merged)
    assert figures["trl_vllm_over_vlrl_step_time"] == pytest.approx(2.0)
    # The peer's peaks next to ours, measured the same two ways.
    assert (figures["trl_vllm_peak_allocated_gib"], figures["trl_vllm_device_peak_used_gib"]) == (9.0, 10.0)
    other = copy.deepcopy(trl_only)
    other["settings"]["prompts"] = 8
    with pytest.raises(ValueError, match="prompts"):
        harness.merge(ours, other)


def test_bad_options_are_one_line_errors():
    r = CliRunner().invoke(app, ["bench", "--fast-decode", "maybe"])
    assert r.exit_code != 0 and "fast-decode" in str(r.exception)
    r = CliRunner().invoke(app, ["bench", "--compare", "verl"])
    assert r.exit_code != 0 and "trl-vllm" in str(r.exception)


@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="TRL is a benchmark-only dependency (the bench extra)"
)
def test_trl_runs_the_same_workload_side_by_side(tmp_path):
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["bench", *TINY, "--compare", "trl", "-o", str(out)])
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    assert result["trl"]["summary"]["step_s"] > 0 and result["trl_over_vlrl_step_time"] > 0
    assert "TRL 1." in r.output


def test_compile_blocks_flag_takes_auto_true_false_and_alone_means_true():
    harness = load_harness()
    parsed = [
        harness.parse_args(argv)[0].compile_blocks for argv in ([], ["--compile-blocks"], ["--compile-blocks", "false"])
    ]
    assert parsed == ["auto", "true", "false"]
    with pytest.raises(SystemExit):
        harness.parse_args(["--compile-blocks", "sometimes"])
