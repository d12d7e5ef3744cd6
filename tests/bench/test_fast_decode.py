"""The transformers engine's fast path (static-cache decoder) against transformers `generate`, on CPU.

On CPU the decoder runs eagerly (`fast_decode=True`); on CUDA the same step is captured as a graph
and replayed, so these tests pin down what each replay computes.
"""

from __future__ import annotations

import pytest
import torch

from vlrl.envs.base import build_split, make_env
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.models.loading import load_policy_model, vision_special_token_ids
from vlrl.models.lora import apply_lora
from vlrl.models.processor import load_processor
from vlrl.rollout.engine import SamplingParams
from vlrl.rollout.hf_engine import TransformersEngine
from vlrl.rollout.sequence import ChatFormat
from vlrl.rollout.static_decoder import StaticDecoder


@pytest.fixture(scope="module")
def parts(ci_model_dir):
    """A LoRA model whose adapter is not zero, and three prompts of two lengths (left padding)."""
    processor = load_processor(ci_model_dir)
    chat = ChatFormat(processor)
    model = apply_lora(load_policy_model(ci_model_dir), 8, 16, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    env_config = MazeEnvConfig(name="maze", sizes=[3], cell_px=16)
    split = build_split(env_config, "train")
    prompts = []
    for i in range(3):
        env = make_env(env_config)
        prompt = chat.prompt(env.system_prompt, env.reset(split[i]))
        if i == 1:  # a second turn: longer, so the batch is left-padded
            prompt.append_sampled([5, 6, 7], [0.0] * 3)
            prompt.extend(chat.observation_piece(env.step("<action>up</action>").observation, response_ended=False))
        prompts.append(prompt)
    assert len({len(p) for p in prompts}) == 2
    return model, processor, chat, prompts


def _engine(parts, fast, **kw) -> TransformersEngine:
    model, processor, chat, _ = parts
    tok = processor.tokenizer
    return TransformersEngine(
        model,
        tok,
        vision_special_token_ids(processor),
        eos_token_id=chat.eos_id,
        pad_token_id=tok.pad_token_id,
        fast_decode=fast,
        **kw,
    )


def _assert_same(a, b, tol=1e-5):
    for per_a, per_b in zip(a, b, strict=True):
        for ca, cb in zip(per_a, per_b, strict=True):
            assert ca.token_ids == cb.token_ids
            assert ca.text == cb.text and ca.finish_reason == cb.finish_reason
            assert max(abs(x - y) for x, y in zip(ca.logprobs, cb.logprobs)) < tol


def test_greedy_completions_match_generate_token_for_token(parts):
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
    slow = _engine(parts, False).generate(parts[3], greedy)
    fast_engine = _engine(parts, True)
    fast = fast_engine.generate(parts[3], greedy)
    _assert_same(slow, fast)
    assert set(fast_engine.timings) == {"prefill_s", "capture_s", "decode_s"}


def test_padded_rows_and_several_samples_per_prompt(parts, monkeypatch):
    # As on CUDA, where rows are padded to a power of two (here 3 prompts x 3 samples -> 16 rows).
    monkeypatch.setattr(StaticDecoder, "bucket_rows_on_cpu", True)
    engine = _engine(parts, True)
    out = engine.generate(parts[3], SamplingParams(n=3, temperature=0.0, max_new_tokens=10))
    reference = _engine(parts, False).generate(parts[3], SamplingParams(n=1, temperature=0.0, max_new_tokens=10))
    assert [len(per) for per in out] == [3, 3, 3]
    for per, (ref,) in zip(out, reference):
        for c in per:  # greedy: every sample of a prompt is the reference completion
            assert c.token_ids == ref.token_ids
    # A shorter call reuses the cached static state (and, on CUDA, its graph).
    shorter = engine.generate(parts[3], SamplingParams(n=3, temperature=0.0, max_new_tokens=6))
    assert len(engine._decoder.states) == 1
    assert [c.token_ids for per in shorter for c in per] == [c.token_ids[:6] for per in out for c in per]


def test_in_place_adapter_updates_are_seen_without_rebuilding(parts):
    model = parts[0]
    fast_engine = _engine(parts, True)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
    before = fast_engine.generate(parts[3], greedy)
    saved = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    try:
        with torch.no_grad():  # what an optimizer step or an adapter sync does: in place
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.mul_(-3.0)
        after = fast_engine.generate(parts[3], greedy)
        _assert_same(_engine(parts, False).generate(parts[3], greedy), after)
        assert [c.token_ids for per in after for c in per] != [c.token_ids for per in before for c in per]
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in saved:
                    p.copy_(saved[name])


def test_sampled_logprobs_match_the_policy_rescoring(parts, ci_config):
    from vlrl.training.policy import Policy

    model, processor, _, prompts = parts
    config = ci_config("rollout.temperature=0.7")
    engine = _engine(parts, True)
    out = engine.generate(prompts, SamplingParams(n=4, temperature=0.7, max_new_tokens=12, seed=3))
    seqs, sampled = [], []
    for prompt, per in zip(prompts, out):
        for c in per:
            seq = prompt.copy()
            seq.append_sampled(c.token_ids, c.logprobs)
            seqs.append(seq)
            sampled.append(torch.tensor(c.logprobs))
    assert len({tuple(s.token_ids) for s in seqs}) > 3  # really sampled
    policy = Policy(model, config, vision_special_token_ids(processor), processor.tokenizer.pad_token_id, 1)
    worst = 0.0
    for lp, rescored in zip(sampled, policy.score_no_grad(seqs)):
        worst = max(worst, float((rescored[-len(lp) :] - lp).abs().max()))  # the completion's own tokens
    assert worst < 1e-4, worst


def test_unsupported_sampling_uses_generate_and_ignore_eos_forces_the_length(parts):
    engine = _engine(parts, True)
    engine.generate(parts[3][:1], SamplingParams(n=2, temperature=1.0, top_p=0.9, max_new_tokens=4, seed=0))
    assert engine.timings == {}  # top_p < 1: the generate path
    engine.generate(parts[3][:1], SamplingParams(n=2, temperature=1.0, max_new_tokens=4, stop=["up"], seed=0))
    assert engine.timings == {}
    eos = parts[2].eos_id
    for fast in (True, False):
        out = _engine(parts, fast, ignore_eos=True).generate(parts[3], SamplingParams(n=2, max_new_tokens=24, seed=1))
        for c in (c for per in out for c in per):
            assert len(c.token_ids) == 24 and eos not in c.token_ids and c.finish_reason == "length"


def test_auto_keeps_the_generate_path_on_cpu(parts):
    engine = _engine(parts, "auto")
    engine.generate(parts[3][:1], SamplingParams(n=1, temperature=0.0, max_new_tokens=4))
    assert engine.timings == {} and engine._decoder is None
    with pytest.raises(ValueError):
        _engine(parts, "on")


def test_token_budget_splits_batches_and_keeps_results(parts):
    # rollout.max_batch_tokens: a budget below two prompts' padded length runs each prompt in a batch
    # of its own (what keeps 13x13 mazes from running the GPU out of memory), with the same completions.
    prompts = parts[3]
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
    whole = _engine(parts, True, batch_size=64).generate(prompts, greedy)
    engine = _engine(parts, True, batch_size=64, max_batch_tokens=max(len(p) for p in prompts) + 1)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    assert engine._batches(order, [len(p) for p in prompts], 2) == [[i] for i in order]
    _assert_same(whole, engine.generate(prompts, greedy))
    # Budgets count padded tokens of the batch's longest prompt; rows still cap at batch_size / n.
    e = _engine(parts, True, batch_size=4, max_batch_tokens=100)
    assert e._batches([0, 1, 2, 3, 4], [10, 10, 20, 30, 200], 2) == [[0, 1], [2, 3], [4]]
    assert _engine(parts, True, batch_size=64)._batches([0, 1, 2], [10, 20, 30], 4) == [[0, 1, 2]]
