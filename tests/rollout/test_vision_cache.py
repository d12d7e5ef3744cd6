"""The fast path's prefill with cached vision features against the uncached prefill (CPU, tiny model).

The uncached prefill is the model's own forward over every image's pixels (what `_prefill` did
before the cache); the cached one assembles the same inputs from per-image features, encoding only
images it has not seen. LoRA is on the vision tower too, so stale features would show.
"""

from __future__ import annotations

import random

import pytest
import torch
from PIL import Image

from vlrl.envs.base import Observation, build_split, make_env
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.models.loading import load_policy_model, vision_special_token_ids
from vlrl.models.lora import adapter_state_dict, apply_lora
from vlrl.models.processor import load_processor
from vlrl.rollout.engine import SamplingParams
from vlrl.rollout.hf_engine import TransformersEngine
from vlrl.rollout.sequence import ChatFormat
from vlrl.rollout.static_decoder import StaticDecoder
from vlrl.rollout.vision_cache import VisionFeatureCache, cached_features_problem

ACTIONS = ["up", "down", "left", "right"]


def _randomise_lora(model, seed: int, scale: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


@pytest.fixture(scope="module")
def parts(ci_model_dir):
    processor = load_processor(ci_model_dir)
    chat = ChatFormat(processor)
    model = apply_lora(load_policy_model(ci_model_dir, dtype="float32"), 8, 16, include_vision=True, seed=0).eval()
    _randomise_lora(model, 0)
    assert any("visual" in n and "lora_B" in n for n, _ in model.named_parameters())
    env_config = MazeEnvConfig(name="maze", sizes=[3], cell_px=16)
    split = build_split(env_config, "train")
    # Conversations of 1, 2, 3 and 2 turns; the last replays the first task, so ChatFormat's image
    # cache gives it the SAME pixel tensor as the first conversation (a shared image). Later turns
    # show other pictures (one of another size: the vision tower's per-image path).
    plan = [(0, 1), (1, 2), (2, 3), (0, 2)]
    warm = make_env(env_config)
    chat.prompt(warm.system_prompt, warm.reset(split[0]))  # ChatFormat's first piece checks the processor's
    convs = []
    for c, (task, turns) in enumerate(plan):
        env = make_env(env_config)
        seq = chat.prompt(env.system_prompt, env.reset(split[task]))
        for t in range(1, turns):
            _play(chat, seq, c, t, size=(32, 48) if (c, t) == (2, 2) else None)
        convs.append(seq)
    assert convs[3].pixel_values[0] is convs[0].pixel_values[0]
    return model, processor, chat, convs


def _picture(size: tuple[int, int], seed: int) -> Image.Image:
    rng = random.Random(seed)
    return Image.frombytes("RGB", size, bytes(rng.randrange(256) for _ in range(size[0] * size[1] * 3)))


def _play(chat, seq, conversation: int, turn: int, size=None) -> None:
    """A response, then the next observation: a picture of its own (the maze screen's size by default)."""
    ids = chat.tokenizer(f"<action>{ACTIONS[turn % 4]}</action>", add_special_tokens=False)["input_ids"] + [chat.eos_id]
    seq.append_sampled(ids, [0.0] * len(ids))
    picture = _picture(size or seq.images[0].size, 1000 * conversation + turn)
    seq.extend(chat.observation_piece(Observation([picture], f"turn {turn}"), response_ended=True))


def _prefill(decoder: StaticDecoder, prompts, pad_id: int):
    with torch.no_grad():
        logits, kv, mask, next_pos = decoder._prefill(prompts, pad_id, torch.device("cpu"))
    return logits, kv, mask, next_pos


def _assert_same_prefill(a, b, tol=1e-5):
    (la, kva, ma, pa), (lb, kvb, mb, pb) = a, b
    assert torch.equal(ma, mb) and torch.equal(pa, pb)
    torch.testing.assert_close(la, lb, atol=tol, rtol=tol)
    for (ka, va), (kb, vb) in zip(kva, kvb, strict=True):
        torch.testing.assert_close(ka, kb, atol=tol, rtol=tol)
        torch.testing.assert_close(va, vb, atol=tol, rtol=tol)


def _next_turn(parts):
    """Each conversation one turn longer (a new image; the earlier ones are the same tensors)."""
    chat, convs = parts[2], parts[3]
    prompts = []
    for c, seq in enumerate(convs):
        longer = seq.copy()
        _play(chat, longer, c, len(seq.images))
        prompts.append(longer)
    return prompts


def test_cached_prefill_equals_uncached_cold_and_warm(parts):
    model, processor, _, convs = parts
    pad = processor.tokenizer.pad_token_id
    prompts = list(convs)
    cached, uncached = StaticDecoder(model), StaticDecoder(model, vision_cache_mb=0)
    assert cached.vision_cache.enabled and cached._cache_problem is None and not uncached.vision_cache.enabled

    cold = _prefill(cached, prompts, pad)
    images = sum(len(p.pixel_values) for p in prompts)
    distinct = len({id(t) for p in prompts for t in p.pixel_values})
    assert distinct < images  # the replayed task's images are shared
    assert cached.vision_stats["images"] == images and cached.vision_stats["encoded"] == distinct
    _assert_same_prefill(cold, _prefill(uncached, prompts, pad))
    assert uncached.vision_stats["encoded"] == images

    longer = _next_turn(parts)
    warm = _prefill(cached, longer, pad)
    assert cached.vision_stats["encoded"] == len(longer)  # only each conversation's new image
    assert cached.vision_stats["images"] == images + len(longer)
    assert cached.vision_stats["pixel_bytes"] < uncached.vision_stats["pixel_bytes"]
    _assert_same_prefill(warm, _prefill(uncached, longer, pad))
    assert cached.vision_cache.invalidations == 0


def test_cache_bound_is_respected_and_results_stay_exact(parts):
    model, processor, _, convs = parts
    pad = processor.tokenizer.pad_token_id
    prompts = list(convs)
    probe = StaticDecoder(model)
    _prefill(probe, prompts[:1], pad)
    one = next(iter(probe.vision_cache.entries.values())).nbytes
    small = StaticDecoder(model)
    small.vision_cache = VisionFeatureCache(int(2.5 * one))  # room for two images, the batch has more
    for batch in (prompts, _next_turn(parts)):
        out = _prefill(small, batch, pad)
        assert small.vision_cache.bytes <= small.vision_cache.max_bytes and len(small.vision_cache.entries) == 2
        _assert_same_prefill(out, _prefill(StaticDecoder(model, vision_cache_mb=0), batch, pad))


def _engine(parts, **kw) -> TransformersEngine:
    model, processor, chat, _ = parts
    tok = processor.tokenizer
    return TransformersEngine(
        model, tok, vision_special_token_ids(processor), eos_token_id=chat.eos_id, pad_token_id=tok.pad_token_id, **kw
    )


@pytest.mark.parametrize("through_update_adapter", [True, False])
def test_changed_lora_weights_drop_the_cached_features(parts, through_update_adapter):
    model, processor, _, convs = parts
    pad = processor.tokenizer.pad_token_id
    prompts = list(convs)
    engine = _engine(parts, fast_decode=True)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=2)
    engine.generate(prompts, greedy)  # the fast path on CPU: builds the decoder and fills the cache
    decoder = engine._decoder
    assert decoder is not None and decoder.vision_cache.entries
    before = _prefill(decoder, prompts, pad)
    assert decoder.vision_stats["encoded"] == 0  # all cached
    saved = adapter_state_dict(model)
    try:
        if through_update_adapter:  # an adapter sync from the trainer (in place)
            new = {k: (v * -3.0 if "lora_B" in k else v) for k, v in saved.items()}
            engine.update_adapter(new, 1)
        else:  # an optimizer step on a shared policy: weights change in place, no call
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "visual" in name and "lora_B" in name:
                        p.mul_(-3.0)
        after = _prefill(decoder, prompts, pad)
        assert decoder.vision_stats["encoded"] == len({id(t) for p in prompts for t in p.pixel_values})
        assert decoder.vision_cache.invalidations == 1
        _assert_same_prefill(after, _prefill(StaticDecoder(model, vision_cache_mb=0), prompts, pad))
        assert not torch.allclose(after[0], before[0], atol=1e-4)
    finally:
        from vlrl.models.lora import load_adapter_state_dict

        load_adapter_state_dict(model, saved)


def test_update_adapter_alone_invalidates(parts):
    prompts = list(parts[3])
    engine = _engine(parts, fast_decode=True, shares_policy=True)  # update_adapter loads nothing
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=2)
    engine.generate(prompts, greedy)
    engine.generate(prompts, greedy)
    assert engine._decoder.vision_stats["encoded"] == 0
    engine.update_adapter({}, 1)
    engine.generate(prompts, greedy)
    assert engine._decoder.vision_stats["encoded"] > 0 and engine._decoder.vision_cache.invalidations == 1


def test_greedy_turns_with_the_cache_match_generate(parts):
    """End to end on CPU: the fast path (forced) with the cache, two turns, against `generate`."""
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    fast, slow = _engine(parts, fast_decode=True), _engine(parts, fast_decode=False)
    for prompts in (list(parts[3]), _next_turn(parts)):
        a, b = fast.generate(prompts, greedy), slow.generate(prompts, greedy)
        assert "prefill_s" in fast.timings and "prefill_s" not in slow.timings
        for per_a, per_b in zip(a, b, strict=True):
            assert per_a[0].token_ids == per_b[0].token_ids
            assert max(abs(x - y) for x, y in zip(per_a[0].logprobs, per_b[0].logprobs)) < 1e-5
    assert fast._decoder.vision_cache.hits > 0


def test_sleep_drops_the_cached_features_and_the_next_rollout_reencodes(parts):
    """The worker puts the engine to sleep before every update: the features' memory goes to it."""
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=4)
    engine = _engine(parts, fast_decode=True)
    prompts = list(parts[3])
    first = engine.generate(prompts, greedy)
    cache = engine._decoder.vision_cache
    assert cache.entries and cache.bytes > 0
    engine.sleep()
    assert not cache.entries and cache.bytes == 0
    engine.wake_up()
    again = engine.generate(prompts, greedy)
    assert engine._decoder.vision_stats["encoded"] == len({id(t) for p in prompts for t in p.pixel_values})
    assert [c[0].token_ids for c in again] == [c[0].token_ids for c in first]


def test_models_without_the_pieces_keep_their_own_forward(parts):
    model = parts[0]
    base = model.get_base_model()

    class NoFeatures:
        visual = base.model.visual
        config = base.model.config

    assert cached_features_problem(NoFeatures(), base.model.language_model) is not None
    assert cached_features_problem(base.model, torch.nn.Linear(2, 2)) is not None
    assert cached_features_problem(base.model, base.model.language_model) is None
    decoder = StaticDecoder(model)
    decoder._cache_problem = "stub"
    prompts = list(parts[3])
    out = _prefill(decoder, prompts, parts[1].tokenizer.pad_token_id)
    assert (
        decoder.vision_stats["encoded"] == sum(len(p.pixel_values) for p in prompts)
        and not decoder.vision_cache.entries
    )
    _assert_same_prefill(
        out, _prefill(StaticDecoder(model, vision_cache_mb=0), prompts, parts[1].tokenizer.pad_token_id)
    )


def test_deepstack_features_as_one_tensor_per_layer_give_the_same_prefill(parts, monkeypatch):
    """transformers 5.17 (the GPU image's) returns each deepstack layer as one [tokens, hidden]
    tensor, 5.19 (here) one tensor per image: the cache must read both. The older form is made here
    by concatenating 5.19's real output (a format shim, not a mock: the vision tower still runs)."""
    model, processor, _, convs = parts
    pad = processor.tokenizer.pad_token_id
    vlm = model.get_base_model().model if hasattr(model, "get_base_model") else model.model
    stock = vlm.get_image_features

    def concatenated(*args, **kwargs):
        out = stock(*args, **kwargs)
        out.deepstack_features = [torch.cat(list(f), dim=0) for f in out.deepstack_features]
        return out

    reference = _prefill(StaticDecoder(model, vision_cache_mb=0), list(convs), pad)
    monkeypatch.setattr(vlm, "get_image_features", concatenated)
    decoder = StaticDecoder(model)
    assert decoder._cache_problem is None
    _assert_same_prefill(_prefill(decoder, list(convs), pad), reference)
    assert decoder.vision_stats["encoded"] > 1
