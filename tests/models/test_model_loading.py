"""Loading a policy model and processor from local directories, and the errors for bad ones."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from model_helpers import chat_inputs, maze_like_image

from vlrl.errors import VlrlError
from vlrl.models import (
    count_checkpoint_parameters,
    count_parameters,
    load_policy_model,
    load_processor,
    vision_special_token_ids,
)


def test_load_policy_model_dtypes(tiny_dir):
    model = load_policy_model(tiny_dir)
    assert model.dtype == torch.float32 and model.config.model_type == "qwen3_vl"
    assert load_policy_model(tiny_dir, dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(VlrlError, match="unknown dtype"):
        load_policy_model(tiny_dir, dtype="int8")


def test_checkpoint_counts_match_loaded_model(tiny_dir):
    from_headers = count_checkpoint_parameters(tiny_dir)
    loaded = count_parameters(load_policy_model(tiny_dir))
    assert from_headers == {k: loaded[k] for k in ("total", "vision", "language")}
    assert loaded["trainable"] == loaded["total"]


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(VlrlError, match="does not exist"):
        load_policy_model(tmp_path / "nope")
    with pytest.raises(VlrlError, match="does not exist"):
        load_processor(tmp_path / "nope")


def test_dir_without_config_is_refused(tmp_path):
    with pytest.raises(VlrlError, match="no config.json"):
        load_policy_model(tmp_path)


def test_other_architecture_is_refused_naming_its_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(VlrlError, match=r"'llama'.*qwen3_vl"):
        load_policy_model(tmp_path)


def test_vision_special_tokens_are_found(processor):
    ids = vision_special_token_ids(processor)
    tok = processor.tokenizer
    names = set(tok.convert_ids_to_tokens(ids))
    assert names == {"<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"}
    assert vision_special_token_ids(tok) == ids


def test_generate_with_suppressed_vision_tokens(tiny_dir, processor):
    model = load_policy_model(tiny_dir).eval()
    texts = ["Move to the red square.", "Cannot move into a wall."]
    enc = chat_inputs(processor, texts, [maze_like_image(80, 0), maze_like_image(80, 1)])
    suppressed = vision_special_token_ids(processor)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, max_new_tokens=24, suppress_tokens=suppressed)
    new_tokens = out[:, enc["input_ids"].shape[1] :]
    assert new_tokens.shape[1] > 0
    assert not torch.isin(new_tokens, torch.tensor(suppressed)).any()


def test_processor_loads_a_real_style_qwen3_vl_layout(tiny_dir, tmp_path):
    """A released Qwen3-VL keeps its chat template in chat_template.json and names the fast image
    processor; load_processor must still read it with the PIL backend."""
    real = tmp_path / "real"
    shutil.copytree(tiny_dir, real)
    template = (real / "chat_template.jinja").read_text()
    (real / "chat_template.jinja").unlink()
    (real / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    config = json.loads((real / "preprocessor_config.json").read_text())
    config.update(
        image_processor_type="Qwen2VLImageProcessorFast",
        patch_size=16,
        size={"longest_edge": 16777216, "shortest_edge": 65536},
    )
    (real / "preprocessor_config.json").write_text(json.dumps(config))
    processor = load_processor(real)
    assert processor.image_processor.patch_size == 16
    assert processor.image_processor.size["shortest_edge"] == 65536
    assert processor.chat_template == template
    enc = chat_inputs(processor, ["hi"], [maze_like_image(80)])
    # 80x80 is below 65536 px, so this processor upscales it to 256x256: 16x16 patches of 16 px.
    assert enc["image_grid_thw"][0].tolist() == [1, 16, 16]


def test_processor_saved_by_transformers_reloads(tiny_dir, processor, tmp_path):
    """A checkpoint written with processor.save_pretrained (nested processor_config.json) loads."""
    saved = tmp_path / "saved"
    processor.save_pretrained(saved)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_dir / name, saved / name)
    assert not (saved / "preprocessor_config.json").exists()
    again = load_processor(saved)
    enc_a = chat_inputs(processor, ["hi"], [maze_like_image()])
    enc_b = chat_inputs(again, ["hi"], [maze_like_image()])
    assert all(torch.equal(enc_a[k], enc_b[k]) for k in enc_a)
