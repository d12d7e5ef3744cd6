"""The batched Qwen3-VL paths against transformers' own per-image code (models/qwen_vl_batched.py)."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from PIL import Image

from vlrl.envs.base import Observation
from vlrl.models import load_policy_model
from vlrl.models.qwen_vl_batched import (
    BatchedQwen3VLVisionAttention,
    mrope_position_ids,
    spatial_merge_size,
    use_batched_vision,
)
from vlrl.rollout.sequence import ChatFormat, collate


def _image(width: int, height: int, seed: int) -> Image.Image:
    rng = random.Random(seed)
    return Image.frombytes("RGB", (width, height), bytes(rng.randrange(256) for _ in range(width * height * 3)))


def _conversation(chat: ChatFormat, sizes: list[tuple[int, int]], seed: int):
    """A multi-turn conversation with one image of each size, responses in between."""
    seq = chat.prompt("Solve it.", Observation([_image(*sizes[0], seed)], "first"))
    for turn, size in enumerate(sizes[1:], start=1):
        ids = chat.tokenizer("<action>up</action>", add_special_tokens=False)["input_ids"] + [chat.eos_id]
        seq.append_sampled(ids, [0.0] * len(ids))
        seq.extend(
            chat.observation_piece(Observation([_image(*size, seed + turn)], f"turn {turn}"), response_ended=True)
        )
    return seq


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_policy_model(tiny_dir, dtype="float32").eval()


@pytest.mark.parametrize("side", ["right", "left"])
def test_mrope_positions_equal_get_rope_index(model, processor, side):
    chat = ChatFormat(processor)
    # Different numbers of turns (so padding), square and non-square images (max(h, w) matters).
    seqs = [
        _conversation(chat, [(48, 48)] * 3, 0),
        _conversation(chat, [(64, 32), (32, 64)], 5),
        _conversation(chat, [(48, 48)], 9),
        _conversation(chat, [(32, 48), (48, 48), (64, 64), (48, 32)], 11),
    ]
    batch = collate(seqs, pad_id=0, side=side)
    expected, _ = model.model.get_rope_index(
        batch["input_ids"],
        mm_token_type_ids=batch["mm_token_type_ids"],
        image_grid_thw=batch["image_grid_thw"],
        attention_mask=batch["attention_mask"],
    )
    ours = mrope_position_ids(batch, spatial_merge_size(model))
    assert ours.shape == expected.shape
    assert torch.equal(ours, expected)


def test_mrope_positions_none_without_images_or_for_other_models(model, processor):
    chat = ChatFormat(processor)
    batch = collate([_conversation(chat, [(48, 48)], 0)], pad_id=0)
    assert mrope_position_ids(batch, None) is None
    text_only = {k: v for k, v in batch.items() if k not in ("pixel_values", "image_grid_thw")}
    assert mrope_position_ids(text_only, 2) is None


def test_logits_with_precomputed_positions_are_the_models_own(model, processor):
    chat = ChatFormat(processor)
    batch = collate([_conversation(chat, [(48, 48)] * 3, 1), _conversation(chat, [(64, 32)], 2)], pad_id=0)
    keys = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids")
    inputs = {k: batch[k] for k in keys}
    with torch.no_grad():
        stock = model(**inputs, use_cache=False).logits
        ours = model(**inputs, position_ids=mrope_position_ids(batch, 2), use_cache=False).logits
    assert torch.equal(stock, ours)


def _vision_outputs(visual, pixels, grid):
    out = visual(pixels, grid_thw=grid)
    return [out.pooler_output, *out.deepstack_features]


def test_batched_vision_equals_stock_outputs_and_gradients(model, processor):
    stock = copy.deepcopy(model)
    swapped = 1 + stock.config.vision_config.depth  # the vision tower and each block's attention
    assert use_batched_vision(stock, enabled=False) == swapped  # load_policy_model had swapped them
    assert use_batched_vision(stock, enabled=False) == 0
    assert not isinstance(stock.model.visual.blocks[0].attn, BatchedQwen3VLVisionAttention)
    batched = copy.deepcopy(stock)
    assert use_batched_vision(batched) == swapped
    assert isinstance(batched.model.visual.blocks[0].attn, BatchedQwen3VLVisionAttention)
    chat = ChatFormat(processor)
    batch = collate([_conversation(chat, [(48, 48)] * 4, 3), _conversation(chat, [(48, 48)] * 2, 4)], pad_id=0)
    pixels, grid = batch["pixel_values"], batch["image_grid_thw"]
    outs = {}
    for name, m in (("stock", stock), ("batched", batched)):
        m.zero_grad()
        got = _vision_outputs(m.model.visual, pixels, grid)
        sum((o.square().sum() for o in got), torch.tensor(0.0)).backward()
        grads = {n: p.grad.clone() for n, p in m.model.visual.named_parameters() if p.grad is not None}
        outs[name] = (got, grads)
    for a, b in zip(outs["stock"][0], outs["batched"][0]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert outs["stock"][1].keys() == outs["batched"][1].keys() and outs["stock"][1]
    for name, grad in outs["stock"][1].items():
        torch.testing.assert_close(outs["batched"][1][name], grad, rtol=1e-4, atol=1e-6)


def test_batched_vision_takes_the_stock_path_for_mixed_sizes(model, processor):
    batched, model = model, copy.deepcopy(model)
    use_batched_vision(model, enabled=False)
    chat = ChatFormat(processor)
    batch = collate([_conversation(chat, [(48, 48), (64, 32), (48, 48)], 6)], pad_id=0)
    with torch.no_grad():
        stock = _vision_outputs(model.model.visual, batch["pixel_values"], batch["image_grid_thw"])
        ours = _vision_outputs(batched.model.visual, batch["pixel_values"], batch["image_grid_thw"])
    for a, b in zip(stock, ours):
        assert torch.equal(a, b)


def test_load_policy_model_uses_the_batched_vision_tower(tiny_dir):
    loaded = load_policy_model(tiny_dir)
    assert isinstance(loaded.model.visual.blocks[0].attn, BatchedQwen3VLVisionAttention)
    assert isinstance(
        load_policy_model(tiny_dir, attn_implementation="eager").model.visual.blocks[0].attn,
        BatchedQwen3VLVisionAttention,
    )  # swapped, but eager attention takes the stock path
