"""Vision-tower LoRA for engines that ignore it: the merge is exact, and serving refuses the unsplit adapter."""

from __future__ import annotations

import json

import pytest
import torch
from model_helpers import chat_inputs, maze_like_image

from vlrl.errors import VlrlError
from vlrl.models.fingerprint import model_fingerprint
from vlrl.models.loading import load_policy_model
from vlrl.models.lora import apply_lora, load_adapter, save_adapter
from vlrl.models.processor import load_processor
from vlrl.models.vision_merge import merge_lora, merge_vision_into_base, vision_tensor_count


@pytest.fixture(scope="module")
def vision_adapter(tiny_dir, tmp_path_factory):
    """An adapter with random LoRA on the language model AND the vision tower, saved with its base."""
    model = apply_lora(load_policy_model(tiny_dir, "float32"), 8, 16.0, 0.0, None, include_vision=True, seed=0)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    return save_adapter(model, tmp_path_factory.mktemp("vision") / "adapter", model_fingerprint(tiny_dir))


def _logits(model, processor, seed: int = 0) -> torch.Tensor:
    inputs = chat_inputs(
        processor, ["Where is the goal?", "Move."], [maze_like_image(64, seed), maze_like_image(64, seed + 1)]
    )
    with torch.no_grad():
        return model(**inputs).logits.float()


def test_merged_base_plus_language_adapter_is_the_trained_policy(tiny_dir, vision_adapter, tmp_path):
    processor = load_processor(tiny_dir)
    assert vision_tensor_count(vision_adapter) > 0
    trained = load_adapter(load_policy_model(tiny_dir, "float32"), vision_adapter)
    base_dir, adapter_dir = merge_vision_into_base(tiny_dir, vision_adapter, tmp_path / "split")
    assert vision_tensor_count(adapter_dir) == 0
    record = json.loads((adapter_dir / "vlrl_adapter.json").read_text())
    assert record["base_fingerprint"] == model_fingerprint(base_dir) != model_fingerprint(tiny_dir)
    assert record["derived_from"]["base_fingerprint"] == model_fingerprint(tiny_dir)
    served = load_adapter(load_policy_model(base_dir, "float32"), adapter_dir)  # checks the new fingerprint
    want, got = _logits(trained, processor), _logits(served, processor)
    assert (want - got).abs().max() < 1e-4  # fp32; the merge is W + scale * B @ A, computed in fp32
    # ...and the vision half matters: the original base with only the language half differs.
    without = load_adapter(load_policy_model(tiny_dir, "float32"), adapter_dir, verify_base=False)
    assert (want - _logits(without, processor)).abs().max() > 1e-3


def test_merge_refuses_what_it_cannot_split(tiny_dir, vision_adapter, tmp_path):
    plain = apply_lora(load_policy_model(tiny_dir, "float32"), 8, 16.0, 0.0, None, seed=0)
    plain_dir = save_adapter(plain, tmp_path / "plain", model_fingerprint(tiny_dir))
    with pytest.raises(VlrlError, match="no LoRA on the vision tower"):
        merge_vision_into_base(tiny_dir, plain_dir, tmp_path / "out1")
    (tmp_path / "taken").mkdir()
    with pytest.raises(VlrlError, match="exists"):
        merge_vision_into_base(tiny_dir, vision_adapter, tmp_path / "taken")
    from vlrl.models.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "other-base", size="ci", seed=1)
    with pytest.raises(VlrlError, match="was trained on base"):
        merge_vision_into_base(other, vision_adapter, tmp_path / "out2")
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()


def test_serving_refuses_an_adapter_with_vision_lora_in_one_line(tiny_dir, vision_adapter):
    from vlrl.serve.adapters import verify_base

    with pytest.raises(VlrlError) as info:
        verify_base(vision_adapter, model_fingerprint(tiny_dir))
    message = str(info.value)
    assert "\n" not in message and "vision tower" in message and "vlrl model merge-vision" in message


def test_serving_a_damaged_adapter_is_one_line(tiny_dir, vision_adapter, tmp_path):
    import shutil

    from vlrl.serve.adapters import verify_base

    broken = tmp_path / "broken"
    shutil.copytree(vision_adapter, broken)
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(VlrlError) as info:
        verify_base(broken, model_fingerprint(tiny_dir))
    assert "\n" not in str(info.value) and "cannot read" in str(info.value)
    (broken / "adapter_model.safetensors").unlink()
    with pytest.raises(VlrlError, match="no adapter_model.safetensors"):
        verify_base(broken, model_fingerprint(tiny_dir))


def _lora(seed: int, out: int = 12, inner: int = 10, rank: int = 4, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(out, inner, generator=g).to(dtype)
    return base, torch.randn(rank, inner, generator=g), torch.randn(out, rank, generator=g) * 0.1


def test_merge_lora_rounds_once_from_fp32_and_writes_into_a_given_tensor():
    base, a, b = _lora(0, dtype=torch.bfloat16)
    want = (base.float() + 0.5 * (b @ a)).to(torch.bfloat16)  # fp32 throughout, one rounding
    assert torch.equal(merge_lora(base, a, b, 0.5), want)
    # Into a slice of a larger (fused) tensor, as the write plan does: the rest stays as it was.
    fused = torch.zeros(3 * base.shape[0], base.shape[1], dtype=torch.bfloat16)
    merge_lora(base, a, b, 0.5, out=fused.narrow(0, base.shape[0], base.shape[0]))
    assert torch.equal(fused[base.shape[0] : 2 * base.shape[0]], want)
    assert not fused[: base.shape[0]].any() and not fused[2 * base.shape[0] :].any()
    with pytest.raises(VlrlError, match="cannot merge w into a torch.float32 tensor"):
        merge_lora(base, a, b, 0.5, "w", out=torch.empty(base.shape))


def test_merge_lora_takes_the_factors_in_the_trainers_dtype():
    """`factor_dtype` bf16 (the trainer's autocast): A and B rounded to bf16 before the product,
    which is still accumulated in fp32 and added to W0 there (on a GPU, one addmm)."""
    base, a, b = _lora(1, dtype=torch.bfloat16)
    got = merge_lora(base, a, b, 2.0, factor_dtype=torch.bfloat16)
    a16, b16 = a.to(torch.bfloat16).float(), b.to(torch.bfloat16).float()
    assert torch.equal(got, (base.float() + 2.0 * (b16 @ a16)).to(torch.bfloat16))
    assert not torch.equal(got, merge_lora(base, a, b, 2.0))  # the factors' rounding shows at this scale
