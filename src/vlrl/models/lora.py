"""LoRA adapters on a Qwen-VL policy: wrap, move weights in memory, save and load.

By default only the language model's attention and MLP projections get adapters; the vision
tower stays frozen (and vLLM serves language-model LoRA only). Module selection uses a regex
anchored on `language_model`, because a plain name list like ["q_proj"] would also match
vision-tower layers of the same name in some architectures (Qwen2.5-VL's vision MLP has
gate/up/down_proj).

A saved adapter is a normal PEFT directory (adapter_config.json + adapter_model.safetensors)
plus `vlrl_adapter.json`, which records the fingerprint of the base weights it was trained on;
loading it on other base weights is refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from torch import nn

from vlrl.errors import VlrlError
from vlrl.models.fingerprint import model_fingerprint

LANGUAGE_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Linear layers inside the vision blocks: Qwen3-VL names (qkv, proj, linear_fc1/2) and
# Qwen2.5-VL's gated MLP. The patch mergers are left out.
VISION_TARGETS = [
    "attn.qkv",
    "attn.proj",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]
ADAPTER_RECORD = "vlrl_adapter.json"
# The frozen copy of a warm-start adapter that GRPO's KL penalty compares with (`add_reference_adapter`).
REFERENCE_ADAPTER = "reference"


def lora_target_regex(target_modules: list[str] | None = None, include_vision: bool = False) -> str:
    """The PEFT `target_modules` regex: the named language-model projections, and optionally
    the vision blocks' linear layers."""
    names = target_modules or LANGUAGE_TARGETS
    pattern = r".*language_model.*\.(" + "|".join(re.escape(n) for n in names) + r")$"
    if include_vision:
        vision = "|".join(re.escape(n) for n in VISION_TARGETS)
        pattern = f"(?:{pattern})|(?:" + r".*visual\.blocks\.\d+\.(" + vision + r")$)"
    return pattern


def _check_targets(model: nn.Module, target_modules: list[str]) -> None:
    """Fail early, with the valid choices, when a requested module name is not in the language model."""
    linear_names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if "language_model" in name and isinstance(module, nn.Linear)
    }
    unknown = [n for n in target_modules if n not in linear_names]
    if unknown:
        raise VlrlError(
            f"LoRA target modules {unknown} are not linear layers of the language model; "
            f"choose from: {', '.join(sorted(linear_names))}"
        )


def apply_lora(
    model: nn.Module,
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    target_modules: list[str] | None = None,
    include_vision: bool = False,
    seed: int | None = None,
) -> PeftModel:
    """Wrap `model` with fresh LoRA adapters (B = 0, so the output is unchanged at first).

    `target_modules` are short names of language-model linears (default: all attention and MLP
    projections); `include_vision` also adapts the vision blocks. Initialisation uses torch's
    global RNG, or a private one seeded with `seed` when given. Only LoRA weights are trainable.
    """
    if rank < 1:
        raise VlrlError(f"LoRA rank must be a positive integer, got {rank}")
    if alpha <= 0:
        raise VlrlError(f"LoRA alpha must be positive, got {alpha}")
    if not 0.0 <= dropout < 1.0:
        raise VlrlError(f"LoRA dropout must be in [0, 1), got {dropout}")
    if target_modules is not None:
        if not target_modules:
            raise VlrlError("LoRA target_modules is empty; leave it unset for the default projections")
        _check_targets(model, target_modules)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=lora_target_regex(target_modules, include_vision),
        bias="none",
    )
    if seed is None:
        return get_peft_model(model, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def adapter_state_dict(peft_model: PeftModel, to_cpu: bool = True) -> dict[str, torch.Tensor]:
    """The LoRA weights only, as detached CPU copies (safe to send to another process); with
    `to_cpu=False` the live tensors where they are, detached (for an engine on the same device)."""
    state = get_peft_model_state_dict(peft_model)
    if not to_cpu:
        return {name: tensor.detach() for name, tensor in state.items()}
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def load_adapter_state_dict(peft_model: PeftModel, state: dict[str, torch.Tensor]) -> None:
    """Copy LoRA weights from `adapter_state_dict` output into `peft_model`, in place.

    The key sets must match exactly; anything else (another rank, other targets) is a VlrlError.
    """
    expected = set(get_peft_model_state_dict(peft_model))
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise VlrlError(
            f"adapter weights do not fit this model: {len(missing)} missing (e.g. {missing[:2]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:2]}); were they made with the same LoRA targets?"
        )
    try:
        set_peft_model_state_dict(peft_model, state)
    except RuntimeError as exc:  # shape mismatch, e.g. a different rank
        first_line = str(exc).splitlines()[0]
        raise VlrlError(f"adapter weights do not fit this model (different LoRA rank?): {first_line}") from exc


def save_adapter(
    peft_model: PeftModel,
    out_dir: str | Path,
    base_fingerprint: str,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a PEFT adapter directory plus `vlrl_adapter.json` with the base fingerprint.

    `state_dict` (from `adapter_state_dict`, e.g. gathered from FSDP shards) is saved instead of
    the model's own LoRA weights when given. The directory is replaced as a whole (written
    aside, then renamed), so a reader such as a vLLM server never sees a half-written adapter.
    """
    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # Only the active (trained) adapter: a frozen reference copy (`add_reference_adapter`) stays out.
    peft_model.save_pretrained(str(tmp), state_dict=state_dict, selected_adapters=[peft_model.active_adapter])
    config = peft_model.peft_config[peft_model.active_adapter]
    record = {"base_fingerprint": base_fingerprint, "rank": config.r, "alpha": config.lora_alpha, "format": 1}
    (tmp / ADAPTER_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(out)
    return out


def read_adapter_record(adapter_dir: str | Path) -> dict:
    """The `vlrl_adapter.json` of an adapter directory (raises VlrlError when absent)."""
    path = Path(adapter_dir)
    if not path.is_dir():
        raise VlrlError(f"adapter path {path} does not exist; pass a directory written by vlrl")
    if not (path / "adapter_config.json").is_file():
        raise VlrlError(f"{path} has no adapter_config.json; it is not a PEFT adapter directory")
    record_file = path / ADAPTER_RECORD
    if not record_file.is_file():
        raise VlrlError(
            f"{path} has no {ADAPTER_RECORD}, so its base model is unknown; pass verify_base=False to load it anyway"
        )
    return json.loads(record_file.read_text(encoding="utf-8"))


def load_adapter(
    base_model: nn.Module,
    adapter_dir: str | Path,
    base_fingerprint: str | None = None,
    is_trainable: bool = False,
    verify_base: bool = True,
) -> PeftModel:
    """Load a saved adapter onto `base_model`, refusing one trained on other base weights.

    The base fingerprint is `base_fingerprint` if given, else computed from the directory the
    base model was loaded from (`base_model.name_or_path`).
    """
    path = Path(adapter_dir)
    if verify_base:
        recorded = read_adapter_record(path).get("base_fingerprint")
        if base_fingerprint is None:
            base_dir = getattr(base_model, "name_or_path", "")
            if not base_dir or not Path(base_dir).is_dir():
                raise VlrlError(
                    "cannot tell which weights the base model has (it was not loaded from a directory); "
                    "pass base_fingerprint"
                )
            base_fingerprint = model_fingerprint(base_dir)
        if recorded != base_fingerprint:
            raise VlrlError(
                f"adapter {path} was trained on base model {recorded}, but this base model is {base_fingerprint}; "
                "load the matching base model"
            )
    elif not (path / "adapter_config.json").is_file():
        raise VlrlError(f"{path} has no adapter_config.json; it is not a PEFT adapter directory")
    return PeftModel.from_pretrained(base_model, str(path), is_trainable=is_trainable)


def add_reference_adapter(peft_model: PeftModel, adapter_dir: str | Path) -> str:
    """Load `adapter_dir` a second time, frozen, as the adapter `REFERENCE_ADAPTER`; the trained
    adapter stays active. Returns the reference adapter's name (for `using_adapter`).

    GRPO from a warm start (`--init-adapter`) needs the warm-start policy as its KL reference;
    the base (adapter disabled) would pull the run back to before the SFT.
    """
    active = peft_model.active_adapter
    peft_model.load_adapter(str(adapter_dir), adapter_name=REFERENCE_ADAPTER, is_trainable=False)
    using = {name for name, p in peft_model.named_parameters() if p.requires_grad and f".{REFERENCE_ADAPTER}." in name}
    if using or peft_model.active_adapter != active:
        raise VlrlError(
            f"the reference adapter loaded from {adapter_dir} is trainable or active; PEFT changed how "
            "load_adapter works"
        )
    return REFERENCE_ADAPTER


@contextmanager
def using_adapter(peft_model: PeftModel, name: str) -> Iterator[None]:
    """Run with the adapter `name` active instead of the current one, leaving every parameter's
    `requires_grad` as it was: PEFT's `set_adapter` flips them, and FSDP2 fixes a parameter's
    flag when it first unshards it, so a flip during a forward could freeze the trained adapter."""
    flags = [(p, p.requires_grad) for p in peft_model.parameters()]
    previous = peft_model.active_adapter

    def switch(to: str) -> None:
        peft_model.set_adapter(to)
        for p, flag in flags:
            p.requires_grad_(flag)

    switch(name)
    try:
        yield
    finally:
        switch(previous)
