"""LoRA: which modules get adapters, in-memory sync, and save/load with base verification."""

from __future__ import annotations

import json

import pytest
import torch
from model_helpers import chat_inputs, maze_like_image

from vlrl.errors import VlrlError
from vlrl.models import (
    adapter_state_dict,
    apply_lora,
    load_adapter,
    load_adapter_state_dict,
    load_policy_model,
    model_fingerprint,
    save_adapter,
)


def lora_module_names(peft_model) -> list[str]:
    return [name for name, module in peft_model.named_modules() if hasattr(module, "lora_A") and module.lora_A]


def randomize_lora_b(peft_model, seed: int) -> None:
    """Fresh LoRA has B = 0 (a no-op); give B values so round trips are meaningful."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.1)


def test_default_targets_language_model_only(tiny_dir):
    model = apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, dropout=0.0)
    names = lora_module_names(model)
    layers = model.config.text_config.num_hidden_layers
    assert len(names) == 7 * layers
    assert all("language_model" in n for n in names)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_include_vision_wraps_vision_blocks(tiny_dir):
    model = apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, dropout=0.0, include_vision=True)
    vision = [n for n in lora_module_names(model) if ".visual." in n]
    depth = model.config.vision_config.depth
    assert len(vision) == 4 * depth  # attn.qkv, attn.proj, mlp.linear_fc1, mlp.linear_fc2 per block
    assert all(".blocks." in n for n in vision)
    language = [n for n in lora_module_names(model) if "language_model" in n]
    assert len(language) == 7 * model.config.text_config.num_hidden_layers


def test_custom_targets_and_bad_arguments(tiny_dir):
    model = apply_lora(load_policy_model(tiny_dir), rank=2, alpha=4, dropout=0.0, target_modules=["q_proj", "v_proj"])
    assert {n.rsplit(".", 1)[-1] for n in lora_module_names(model)} == {"q_proj", "v_proj"}
    with pytest.raises(VlrlError, match="qkv_proj"):
        apply_lora(load_policy_model(tiny_dir), rank=2, alpha=4, dropout=0.0, target_modules=["qkv_proj"])
    with pytest.raises(VlrlError, match="rank"):
        apply_lora(load_policy_model(tiny_dir), rank=0, alpha=4, dropout=0.0)


def test_seeded_init_is_deterministic(tiny_dir):
    a = adapter_state_dict(apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, seed=3))
    b = adapter_state_dict(apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, seed=3))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_in_memory_sync(tiny_dir):
    source = apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, seed=0)
    randomize_lora_b(source, seed=1)
    state = adapter_state_dict(source)
    assert all(t.device.type == "cpu" and not t.requires_grad for t in state.values())
    target = apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, seed=5)
    load_adapter_state_dict(target, state)
    synced = adapter_state_dict(target)
    assert all(torch.equal(synced[k], state[k]) for k in state)
    # A state of another rank does not fit.
    other = adapter_state_dict(apply_lora(load_policy_model(tiny_dir), rank=2, alpha=4, seed=0))
    with pytest.raises(VlrlError, match="do not fit"):
        load_adapter_state_dict(target, other)


def test_save_and_load_round_trip(tiny_dir, processor, tmp_path):
    fingerprint = model_fingerprint(tiny_dir)
    trained = apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, seed=0).eval()
    randomize_lora_b(trained, seed=2)
    adapter_dir = save_adapter(trained, tmp_path / "adapter", fingerprint)
    files = {p.name for p in adapter_dir.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "vlrl_adapter.json"} <= files
    assert json.loads((adapter_dir / "vlrl_adapter.json").read_text())["base_fingerprint"] == fingerprint
    save_adapter(trained, adapter_dir, fingerprint)  # overwriting an adapter in place works

    loaded = load_adapter(load_policy_model(tiny_dir), adapter_dir).eval()
    a, b = adapter_state_dict(trained), adapter_state_dict(loaded)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    enc = chat_inputs(processor, ["Move to the red square."], [maze_like_image()])
    with torch.no_grad():
        assert torch.equal(trained(**enc).logits, loaded(**enc).logits)


def test_adapter_for_other_base_is_refused(tiny_dir, tmp_path):
    model = apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, seed=0)
    other = "sha256:" + "0" * 64
    save_adapter(model, tmp_path / "adapter", other)
    with pytest.raises(VlrlError) as excinfo:
        load_adapter(load_policy_model(tiny_dir), tmp_path / "adapter")
    assert other in str(excinfo.value) and model_fingerprint(tiny_dir) in str(excinfo.value)
    # Explicitly skipping verification still loads it.
    load_adapter(load_policy_model(tiny_dir), tmp_path / "adapter", verify_base=False)
    with pytest.raises(VlrlError, match="does not exist"):
        load_adapter(load_policy_model(tiny_dir), tmp_path / "nope")


def test_save_adapter_from_a_state_dict(tiny_dir, tmp_path):
    """A learner can write weights it holds as a state dict (e.g. gathered from FSDP shards)."""
    fingerprint = model_fingerprint(tiny_dir)
    source = apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, seed=0)
    randomize_lora_b(source, seed=4)
    state = adapter_state_dict(source)
    holder = apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, seed=9)
    save_adapter(holder, tmp_path / "adapter", fingerprint, state_dict=state)
    loaded = adapter_state_dict(load_adapter(load_policy_model(tiny_dir), tmp_path / "adapter"))
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)


def test_the_on_device_gather_is_peft_s_state_dict_and_follows_new_lora_modules(tiny_dir):
    """The merged sync's gather (`gather_adapter_state(to_cpu=False)`) keeps PEFT's key mapping
    from the first call instead of walking the whole state dict each sync: it must give PEFT's
    own keys and the live values, and notice when LoRA modules come or go."""
    from vlrl.runtime.distributed import gather_adapter_state

    model = apply_lora(load_policy_model(tiny_dir), rank=4, alpha=8, seed=0)
    randomize_lora_b(model, seed=1)

    def same_as_peft():
        state, want = gather_adapter_state(model, to_cpu=False), adapter_state_dict(model, to_cpu=False)
        assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in want)
        return state

    same_as_peft()
    name, param = next((n, p) for n, p in model.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        param.add_(1.0)  # a training step, in place: the cached mapping reads the new values
    same_as_peft()
    layer = model.base_model.model.model.language_model.layers[0].mlp.down_proj
    for part in (layer.lora_A, layer.lora_B):  # a LoRA module goes
        part.pop("default")
    fewer = same_as_peft()
    model.add_adapter("other", model.peft_config["default"])  # another adapter's modules come
    assert same_as_peft().keys() == fewer.keys()
