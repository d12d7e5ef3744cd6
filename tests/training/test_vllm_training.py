"""GRPO training with the vLLM rollout engine (CPU build) on the tiny model.

Runs in the vLLM lane (`scripts/test-vllm.sh`), where a broken vLLM fails it; elsewhere it skips
where vLLM is not usable (tests/vllm_lane.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from vllm_lane import require_vllm

require_vllm()

from vlrl.envs.base import build_split, make_env  # noqa: E402
from vlrl.rollout.engine import SamplingParams  # noqa: E402
from vlrl.training.trainer import GRPOTrainer  # noqa: E402

pytestmark = pytest.mark.vllm


def _numbers(history):
    return [{k: v for k, v in h.items() if not k.startswith(("time/", "throughput/"))} for h in history]


def test_short_grpo_run_with_vllm_rollouts(ci_config, tmp_path):
    from vlrl.rollout.vllm_engine import VLLMEngine

    cfg = ci_config("rollout.engine=vllm", "rollout.kv_cache_memory_mb=64", "train.steps=2", "train.eval_tasks=2")
    trainer = GRPOTrainer(cfg, tmp_path / "run")
    trainer.setup()
    adapter_dir = trainer.train()
    worker = trainer.worker
    engine = worker.engine
    assert isinstance(engine, VLLMEngine) and engine.adapter_version == 2
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert all(0 <= x["time/sync_s"] < 5 and x["throughput/rollout_tokens_per_s"] > 0 for x in lines)
    assert all(torch.isfinite(torch.tensor(x["train/loss"])) for x in lines)
    assert (adapter_dir / "adapter_model.safetensors").is_file()
    assert len(engine.sync_times) == 3  # the initial adapter, then one per step

    # The engine serves the adapter just trained: its greedy log-probs equal the policy's re-scoring.
    env = make_env(cfg.env)
    prompt = worker.chat.prompt(env.system_prompt, env.reset(build_split(cfg.env, "train")[0]))
    comp = engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=8))[0][0]
    seq = prompt.copy()
    seq.append_sampled(comp.token_ids, comp.logprobs)
    cfg.rollout.temperature = 1.0
    rescored = worker.policy.score_no_grad([seq])[0][-len(comp.token_ids) :]
    assert float((rescored - torch.tensor(comp.logprobs)).abs().max()) < 2e-5
    trainer.close()
    engine.close()


def test_seeded_vllm_runs_are_reproducible(ci_config, tmp_path):
    """Two seeded runs with vLLM rollouts give the same episodes, rewards, losses and adapter."""
    runs = []
    for name in ("a", "b"):
        cfg = ci_config(
            "rollout.engine=vllm",
            "rollout.kv_cache_memory_mb=32",
            "env.max_turns=3",
            "algo.tasks_per_step=1",
            "algo.mini_batch_size=4",
        )
        trainer = GRPOTrainer(cfg, tmp_path / name)
        trainer.setup()
        for _ in range(2):
            trainer.step()
        runs.append((trainer.worker.adapter_state(), _numbers(trainer.history)))
        trainer.worker.engine.close()
        trainer.close()
    (sa, ha), (sb, hb) = runs
    assert ha == hb
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
