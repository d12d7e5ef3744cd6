"""The tiny model factory: loading, size, tokenizer, processor and determinism."""

from __future__ import annotations

import json

import pytest
import torch
from model_helpers import chat_inputs, maze_like_image
from transformers import AutoModelForImageTextToText, Qwen3VLForConditionalGeneration

from vlrl.errors import VlrlError
from vlrl.models import TINY_SPECS, build_tiny_model, count_parameters, model_fingerprint


def test_loads_with_transformers_and_is_small(tiny_dir):
    model = Qwen3VLForConditionalGeneration.from_pretrained(tiny_dir, local_files_only=True)
    assert model.dtype == torch.float32
    counts = count_parameters(model)
    assert counts["total"] < 1_000_000
    assert counts["vision"] > 0 and counts["language"] > 0
    assert counts["total"] == counts["vision"] + counts["language"]
    auto = AutoModelForImageTextToText.from_pretrained(tiny_dir, local_files_only=True)
    assert type(auto) is Qwen3VLForConditionalGeneration
    record = json.loads((tiny_dir / "vlrl_tiny.json").read_text())
    assert record["size"] == "ci" and record["seed"] == 0


def test_head_dim_fits_vllm_cpu():
    for spec in TINY_SPECS.values():
        assert spec.head_dim % 32 == 0 and spec.head_dim >= 32


def test_action_tags_are_few_tokens_and_round_trip(processor):
    tok = processor.tokenizer
    for text in ["<action>right</action>", "<action>stop</action>", "<answer>up</answer>"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) <= 4
        assert tok.decode(ids, skip_special_tokens=True) == text
    sentence = "Cannot move into a wall."
    ids = tok(sentence)["input_ids"]
    assert len(ids) <= 8 and tok.decode(ids) == sentence
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_chat_template_matches_qwen_format(processor):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Move to the red square."}]},
    ]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Move to the red square.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = processor.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=False)
    assert no_prompt.endswith("<|im_end|>\n")


@pytest.mark.parametrize("side", [80, 112])
def test_small_images_are_not_upscaled(processor, side):
    enc = chat_inputs(processor, ["Where next?"], [maze_like_image(side)])
    t, h, w = enc["image_grid_thw"][0].tolist()
    assert (t, h * 8, w * 8) == (1, side, side)  # patch 8: grid * patch = original pixels
    image_tokens = int((enc["input_ids"] == processor.image_token_id).sum())
    assert image_tokens == h * w // 4  # merge 2x2
    assert enc["mm_token_type_ids"].sum() == image_tokens


def test_forward_with_image_returns_logits(tiny_dir, processor):
    model = Qwen3VLForConditionalGeneration.from_pretrained(tiny_dir, local_files_only=True)
    enc = chat_inputs(processor, ["You are the blue circle. Move to the red square."], [maze_like_image()])
    assert "mm_token_type_ids" in enc
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (*enc["input_ids"].shape, model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()


def test_same_seed_same_weights_other_seed_differs(tiny_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", size="ci", seed=0)
    other = build_tiny_model(tmp_path / "other", size="ci", seed=1)
    assert model_fingerprint(again) == model_fingerprint(tiny_dir)
    assert model_fingerprint(other) != model_fingerprint(tiny_dir)
    assert (again / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()


def test_build_refuses_non_empty_dir_and_bad_size(tiny_dir, tmp_path):
    with pytest.raises(VlrlError, match="already exists"):
        build_tiny_model(tiny_dir)
    with pytest.raises(VlrlError, match="unknown tiny model size"):
        build_tiny_model(tmp_path / "x", size="huge")  # type: ignore[arg-type]
    a_file = tmp_path / "model.txt"
    a_file.write_text("keep me")
    with pytest.raises(VlrlError, match="is a file, not a directory"):
        build_tiny_model(a_file, overwrite=True)  # even with --overwrite: a file is not a model directory
    assert a_file.read_text() == "keep me"
