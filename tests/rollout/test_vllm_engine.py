"""The vLLM engine (CPU build) against the transformers engine: tokens, log-probs, adapter sync.

Tests marked `vllm` run in the vLLM lane (`scripts/test-vllm.sh`, `.venv-vllm`), where a broken
vLLM fails them; elsewhere they skip where vLLM is not usable (tests/vllm_lane.py). One vLLM engine and one transformers
worker are shared by the module;
each test first puts the adapter it needs into both (`_set_adapter`).

Observed on 2 CPU cores, float32 (3 adapters x 8 prompts, 4 six-turn episodes each): greedy
tokens identical; worst log-prob gap 1.9e-6 on first-turn image prompts, 9.5e-7 over whole 6-image
episodes, 1.4e-6 between sampled (T=0.7) log-probs and the policy's re-scoring. Asserted: `LOGPROB_TOL`.
"""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch
from vllm_lane import first_prompts, require_vllm, set_lora_b

from vlrl.envs.base import build_split
from vlrl.errors import VlrlError
from vlrl.rollout.engine import SamplingParams
from vlrl.rollout.episodes import run_episodes
from vlrl.rollout.factory import resolve_engine_name

LOGPROB_TOL = 2e-5  # fp32; observed <= 2e-6 (see the module docstring)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def vllm_module():
    return require_vllm()


def _worker_and_engine(ci_model_dir, *overrides: str, kv_cache_memory_mb: int = 64):
    """A transformers worker and a vLLM engine on the same tiny base model and config."""
    from vlrl.config import load_config
    from vlrl.rollout.vllm_engine import VLLMEngine, vllm_lora_config
    from vlrl.training.worker import Worker

    cfg = load_config(
        "configs/ci-tiny.yaml",
        [f"model.path={ci_model_dir}", "runtime.backend=local", "rollout.engine=transformers", *overrides],
    )
    worker = Worker(cfg, total_optimizer_steps=8)
    engine = VLLMEngine(
        ci_model_dir,
        worker.processor.tokenizer,
        worker.suppress,
        eos_token_id=worker.chat.eos_id,
        lora_config=vllm_lora_config(worker.model),
        max_model_len=cfg.rollout.max_model_len,
        max_images=cfg.env.max_turns,
        kv_cache_memory_mb=kv_cache_memory_mb,
        seed=0,
    )
    return worker, engine


@pytest.fixture(scope="module")
def pair(vllm_module, ci_model_dir):
    """(transformers worker, vLLM engine) on the same tiny base model and config."""
    worker, engine = _worker_and_engine(ci_model_dir)
    yield worker, engine
    engine.close()


def _set_adapter(worker, engine, seed: int, version: int, scale: float = 0.3) -> float:
    """Random LoRA B weights (so the adapter changes outputs) in the policy, then synced to vLLM."""
    set_lora_b(worker, seed, scale)
    return engine.update_adapter(worker.adapter_state(), version)


def _worst_logprob_gap(a, b) -> float:
    worst = 0.0
    for per_a, per_b in zip(a, b):
        for ca, cb in zip(per_a, per_b):
            assert ca.token_ids == cb.token_ids
            worst = max([worst] + [abs(x - y) for x, y in zip(ca.logprobs, cb.logprobs)])
    return worst


@pytest.mark.vllm
def test_greedy_parity_on_image_prompts(pair):
    worker, engine = pair
    _set_adapter(worker, engine, seed=1, version=1)
    prompts = first_prompts(worker, 4)
    hf = worker.engine.generate(prompts, GREEDY)
    vl = engine.generate(prompts, GREEDY)
    assert [[c.token_ids for c in p] for p in vl] == [[c.token_ids for c in p] for p in hf]
    assert [p[0].text for p in vl] == [p[0].text for p in hf]
    assert [p[0].finish_reason for p in vl] == [p[0].finish_reason for p in hf]
    assert _worst_logprob_gap(hf, vl) < LOGPROB_TOL
    # The adapter matters: the base model alone answers differently.
    with worker.model.disable_adapter():
        base = worker.engine.generate(prompts, GREEDY)
    assert [p[0].token_ids for p in base] != [p[0].token_ids for p in vl]


@pytest.mark.vllm
def test_multi_turn_episodes_match_transformers_token_for_token(pair):
    """Whole greedy maze episodes (6 turns, an image per turn) through both engines: the same
    token sequences, loss masks, log-probs within tolerance and the same trace format."""
    worker, engine = pair
    _set_adapter(worker, engine, seed=2, version=worker.engine.adapter_version)
    tasks = build_split(worker.config.env, "train")
    tasks = [tasks[i] for i in range(2)]
    runs = {}
    for name, eng in (("transformers", worker.engine), ("vllm", engine)):
        runs[name] = run_episodes(
            eng, worker.chat, worker.config.env, tasks, 1, GREEDY, worker.config.rollout.max_model_len
        )
    hf, vl = runs["transformers"], runs["vllm"]
    assert max(len(e.sequence.images) for e in vl) >= 3  # really multi-turn, several images per prompt
    worst = 0.0
    for a, b in zip(hf, vl):
        assert b.sequence.token_ids == a.sequence.token_ids
        assert b.sequence.loss_mask == a.sequence.loss_mask
        assert b.sequence.mm_token_type_ids == a.sequence.mm_token_type_ids
        worst = max(worst, max(abs(x - y) for x, y in zip(a.sequence.logprobs, b.sequence.logprobs)))
        assert b.turn_rewards == a.turn_rewards and b.metrics == a.metrics
        assert b.trace == a.trace  # same format and content, turn by turn
    assert worst < LOGPROB_TOL, worst


@pytest.mark.vllm
def test_sampled_logprobs_are_those_of_the_tempered_distribution(pair):
    """vLLM's log-probs at temperature 0.7 equal the policy's re-scoring of the sampled tokens
    (logits / T, vision tokens removed), and seeds make sampling reproducible."""
    worker, engine = pair
    _set_adapter(worker, engine, seed=3, version=3, scale=0.05)
    prompts = first_prompts(worker, 2)
    params = SamplingParams(temperature=0.7, max_new_tokens=8, n=4, seed=11)
    out = engine.generate(prompts + prompts[:1], params)  # the first prompt twice
    again = engine.generate(prompts + prompts[:1], params)
    ids = [[c.token_ids for c in per] for per in out]
    assert ids == [[c.token_ids for c in per] for per in again]
    assert len({tuple(t) for t in ids[0]}) > 1  # the n samples differ
    assert ids[0] != ids[2]  # so do two copies of one prompt in a batch
    suppress = set(worker.suppress)
    seqs, sampled = [], []
    for prompt, per in zip(prompts, out):
        for comp in per:
            assert not suppress & set(comp.token_ids)
            seq = prompt.copy()
            seq.append_sampled(comp.token_ids, comp.logprobs)
            seqs.append(seq)
            sampled.append(comp)
    worker.config.rollout.temperature = 0.7  # the policy re-scores at the rollout temperature
    try:
        rescored = worker.policy.score_no_grad(seqs)
    finally:
        worker.config.rollout.temperature = 1.0
    worst = 0.0
    for _seq, lp, comp in zip(seqs, rescored, sampled):
        n = len(comp.token_ids)
        worst = max(worst, float((lp[-n:] - torch.tensor(comp.logprobs)).abs().max()))
    assert worst < LOGPROB_TOL, worst


@pytest.mark.vllm
def test_after_an_optimizer_step_vllm_serves_the_updated_policy(pair):
    worker, engine = pair
    _set_adapter(worker, engine, seed=4, version=4, scale=0.05)
    tasks = build_split(worker.config.env, "train")
    # Episodes sampled by vLLM (its log-probs become the update's old log-probs' reference).
    short = worker.config.env.model_copy(update={"max_turns": 2})  # a cheap update
    episodes = run_episodes(
        engine, worker.chat, short, [tasks[0]], 4, worker.sampling_params(seed=5), worker.config.rollout.max_model_len
    )
    prompts = first_prompts(worker, 3)
    before = engine.generate(prompts, GREEDY)
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(episodes))]
    worker.update(episodes, advantages, seed=0)
    worker.sync_adapter(5)  # gathers the adapter and hands it to... the transformers engine
    engine.update_adapter(worker.adapter_state(), 5)
    after = engine.generate(prompts, GREEDY)
    hf = worker.engine.generate(prompts, GREEDY)
    assert _worst_logprob_gap(hf, after) < LOGPROB_TOL
    changed = max(abs(x - y) for p, q in zip(before, after) for x, y in zip(p[0].logprobs, q[0].logprobs))
    assert changed > 1e-4, changed
    assert engine.adapter_version == 5


@pytest.mark.vllm
def test_no_stale_adapter_after_many_syncs(pair):
    """Each sync gets a fresh adapter id and name; reusing one would serve cached old weights."""
    worker, engine = pair
    prompts = first_prompts(worker, 1, start=5)
    seen = []
    for k, seed in enumerate([10, 11, 10, 12]):  # seed 10 twice: back to an earlier adapter
        _set_adapter(worker, engine, seed=seed, version=100 + k)
        vl = engine.generate(prompts, GREEDY)
        assert _worst_logprob_gap(worker.engine.generate(prompts, GREEDY), vl) < LOGPROB_TOL, f"sync {k}"
        seen.append((vl[0][0].token_ids, vl[0][0].logprobs))

    def same(a, b):
        return a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1], b[1])) < 1e-6

    assert not same(seen[0], seen[1]) and not same(seen[2], seen[3])
    assert same(seen[0], seen[2])  # adapter 10 again, not the cached 11
    assert engine.llm.llm_engine.list_loras() == {engine._lora_request.lora_int_id}  # only the current one
    assert all(t < 5.0 for t in engine.sync_times)


@pytest.mark.vllm
def test_a_refused_adapter_leaves_the_served_one_in_place(pair):
    worker, engine = pair
    _set_adapter(worker, engine, seed=30, version=30)
    prompts = first_prompts(worker, 1)
    with pytest.raises(VlrlError, match="vLLM refused adapter version 31"):
        engine.update_adapter({"not.a.lora.weight": torch.zeros(2, 2)}, 31)
    assert engine.adapter_version == 30
    assert _worst_logprob_gap(worker.engine.generate(prompts, GREEDY), engine.generate(prompts, GREEDY)) < LOGPROB_TOL


@pytest.mark.vllm
def test_disk_transport_serves_fresh_adapters_and_cleans_up(pair, ci_model_dir):
    """The fallback for vLLMs without the in-memory hook: a worker-local temporary directory."""
    from vlrl.rollout.vllm_engine import VLLMEngine, vllm_lora_config

    worker, _ = pair
    engine = VLLMEngine(
        ci_model_dir,
        worker.processor.tokenizer,
        worker.suppress,
        eos_token_id=worker.chat.eos_id,
        lora_config=vllm_lora_config(worker.model),
        max_model_len=512,
        max_images=2,
        kv_cache_memory_mb=32,
        adapter_transport="disk",
    )
    try:
        prompts = first_prompts(worker, 2)
        for k, seed in enumerate([20, 21, 20]):
            _set_adapter(worker, engine, seed=seed, version=k + 1)
            assert (
                _worst_logprob_gap(worker.engine.generate(prompts, GREEDY), engine.generate(prompts, GREEDY))
                < LOGPROB_TOL
            )
        root = engine._tmp_root
        assert root is not None and [p.name for p in root.iterdir()] == ["adapter-3"]
    finally:
        engine.close()
    assert not root.exists()


@pytest.mark.vllm
def test_sleep_is_skipped_on_cpu_and_bad_prompts_are_refused(pair, caplog):
    worker, engine = pair
    with caplog.at_level(logging.INFO, logger="vlrl.rollout.vllm_engine"):
        engine.sleep()
        engine.wake_up()
        engine.sleep()
    assert sum("sleep mode does not exist on CPU" in r.message for r in caplog.records) <= 1
    prompt = first_prompts(worker, 1)[0]
    prompt.images = []  # placeholders without their image
    with pytest.raises(VlrlError, match="image placeholder"):
        engine.generate([prompt], GREEDY)


@pytest.mark.vllm
def test_auto_picks_vllm_where_it_is_installed(vllm_module):
    assert resolve_engine_name("auto") == "vllm"
    assert resolve_engine_name("transformers") == "transformers"


def test_asking_for_an_absent_vllm_is_one_clear_error(ci_config, monkeypatch):
    """Runs in both venvs: `sys.modules['vllm'] = None` makes vLLM absent for this test."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert resolve_engine_name("auto") == "transformers"
    with pytest.raises(VlrlError, match="vLLM is not installed"):
        resolve_engine_name("vllm")
    from vlrl.training.worker import Worker

    with pytest.raises(VlrlError, match="rollout.engine=transformers"):
        Worker(ci_config("rollout.engine=vllm"), total_optimizer_steps=1)


@pytest.fixture(scope="module")
def vision_pair(vllm_module, ci_model_dir):
    """(transformers worker, vLLM engine) for an adapter with LoRA on the vision tower too."""
    worker, engine = _worker_and_engine(ci_model_dir, "model.lora.include_vision=true", kv_cache_memory_mb=32)
    yield worker, engine
    engine.close()


def _set_vision_lora_b(worker, value_scale: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in worker.model.named_parameters():
            if "lora_B" in name and ".visual." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * value_scale)


@pytest.mark.vllm
def test_vision_tower_lora_is_served_not_dropped(vision_pair):
    """vLLM ignores LoRA on the vision tower (vllm-project/vllm#32541); the engine merges it into
    the served vision weights, so vLLM samples the trained policy: same greedy tokens and log-probs
    as the transformers policy, and zeroing the vision half changes vLLM's answers."""
    worker, engine = vision_pair
    assert any(".visual." in k for k in worker.adapter_state())
    prompts = first_prompts(worker, 4)
    _set_adapter(worker, engine, seed=40, version=1)  # every lora_B, vision ones included
    with_vision = engine.generate(prompts, GREEDY)
    assert _worst_logprob_gap(worker.engine.generate(prompts, GREEDY), with_vision) < LOGPROB_TOL
    _set_vision_lora_b(worker, 0.0, seed=0)  # the same adapter without its vision half
    engine.update_adapter(worker.adapter_state(), 2)
    without = engine.generate(prompts, GREEDY)
    assert _worst_logprob_gap(worker.engine.generate(prompts, GREEDY), without) < LOGPROB_TOL
    changed = max(abs(x - y) for p, q in zip(with_vision, without) for x, y in zip(p[0].logprobs, q[0].logprobs))
    assert changed > 1e-3, changed
    # Back to a vision adapter: the merge starts from the base weights, not from the last merge.
    _set_adapter(worker, engine, seed=40, version=3)
    assert _worst_logprob_gap(with_vision, engine.generate(prompts, GREEDY)) < LOGPROB_TOL


@pytest.mark.vllm
def test_a_failing_in_memory_load_falls_back_to_files_for_good(pair, monkeypatch, caplog):
    """When the in-memory path fails at load time (as vLLM 0.24 did with a 0.32-only call), the
    same adapter is loaded from files, the engine keeps using files, and says so."""
    from vlrl.rollout import vllm_compat

    worker, engine = pair
    assert engine.adapter_transport == "memory"
    real = vllm_compat.register_memory_adapter

    def broken(vllm_worker, lora_id, tensors, config):  # the in-memory path fails inside vLLM's load
        real(vllm_worker, lora_id, tensors, {**config, "r": 100_000})

    monkeypatch.setattr(vllm_compat, "register_memory_adapter", broken)
    prompts = first_prompts(worker, 2)
    try:
        with caplog.at_level(logging.WARNING, logger="vlrl.rollout.vllm_engine"):
            _set_adapter(worker, engine, seed=50, version=50)
        assert engine.adapter_transport == "disk"
        assert any("transport: disk" in r.message for r in caplog.records)
        assert str(engine._tmp_root).startswith("/dev/shm") or not __import__("os").path.isdir("/dev/shm")
        assert (
            _worst_logprob_gap(worker.engine.generate(prompts, GREEDY), engine.generate(prompts, GREEDY)) < LOGPROB_TOL
        )
        _set_adapter(worker, engine, seed=51, version=51)  # later versions go through files directly
        assert (
            _worst_logprob_gap(worker.engine.generate(prompts, GREEDY), engine.generate(prompts, GREEDY)) < LOGPROB_TOL
        )
    finally:
        engine.adapter_transport = "memory"  # the module's other tests expect the in-memory path


@pytest.mark.vllm
def test_split_adapter_served_by_plain_vllm_is_the_trained_policy(vision_pair, ci_model_dir, tmp_path):
    """What `vlrl serve` serves after `vlrl model merge-vision`: vLLM with the merged base and the
    language-model half (plain vLLM LoRA, nothing merged by the engine) answers as the trained policy."""
    from safetensors.torch import load_file

    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.vision_merge import merge_vision_into_base
    from vlrl.rollout.vllm_engine import VLLMEngine

    worker, _ = vision_pair
    _set_vision_lora_b(worker, 0.3, seed=60)
    saved = worker.save_adapter(tmp_path / "adapter")
    base_dir, adapter_dir = merge_vision_into_base(ci_model_dir, saved, tmp_path / "split")
    lm_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    engine = VLLMEngine(
        base_dir,
        worker.processor.tokenizer,
        worker.suppress,
        eos_token_id=worker.chat.eos_id,
        lora_config={k: lm_config[k] for k in ("r", "lora_alpha", "target_modules")},
        max_model_len=1024,
        max_images=2,
        kv_cache_memory_mb=32,
    )
    try:
        engine.update_adapter(load_file(str(adapter_dir / "adapter_model.safetensors")), 1)
        assert engine._vision_base is None  # nothing merged by the engine: plain vLLM LoRA
        prompts = first_prompts(worker, 4)
        assert (
            _worst_logprob_gap(worker.engine.generate(prompts, GREEDY), engine.generate(prompts, GREEDY)) < LOGPROB_TOL
        )
    finally:
        engine.close()
    assert model_fingerprint(base_dir) != model_fingerprint(ci_model_dir)
