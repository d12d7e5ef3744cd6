"""Load a policy model from a local directory, with errors a user can act on.

Only local files are ever read (`local_files_only=True`): a model is a directory, built by
`build_tiny_model` or downloaded beforehand. Supported architectures are Qwen3-VL and, because
`AutoModelForImageTextToText` handles it the same way, Qwen2.5-VL.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoModelForImageTextToText, PreTrainedModel
from transformers.utils import logging as hf_logging

from vlrl.config import ModelConfig, RunConfig
from vlrl.errors import VlrlError
from vlrl.models.qwen_vl_batched import use_batched_vision

# Tiny models load in milliseconds and big ones are loaded by every worker: transformers'
# per-load progress bars would only flood logs and job output.
hf_logging.disable_progress_bar()

SUPPORTED_MODEL_TYPES = ("qwen3_vl", "qwen2_5_vl")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Tokens that only the processor may place; a sampler must never emit them, or re-scoring the
# sample fails ("Image features and image tokens do not match").
VISION_SPECIAL_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")


def ensure_model(model: ModelConfig) -> Path:
    """The base model directory, built offline first when `model.init_tiny` asks for it."""
    path = Path(model.path)
    if not path.exists() and model.init_tiny:
        from vlrl.models.tiny import build_tiny_model

        build_tiny_model(path, size=model.init_tiny, seed=0)
    return path


def worker_device(config: RunConfig) -> torch.device:
    """The device a worker (or SFT, or an evaluation) runs the policy on: its GPU with `runtime.use_gpu`, else CPU."""
    if not config.runtime.use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        raise VlrlError(
            f"runtime.use_gpu is true but this worker sees no CUDA device (CUDA_VISIBLE_DEVICES={visible}); "
            "set runtime.use_gpu=false"
        )
    return torch.device("cuda", torch.cuda.current_device())


def read_model_config(model_dir: str | Path) -> dict:
    """Return config.json of a supported model directory as a dict, or raise a VlrlError."""
    path = Path(model_dir)
    if not path.exists():
        raise VlrlError(
            f"model path {path} does not exist; pass a local model directory (e.g. from `vlrl model init-tiny`)"
        )
    if not path.is_dir():
        raise VlrlError(f"model path {path} is not a directory; pass the directory that holds config.json")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise VlrlError(f"{path} has no config.json; it is not a Hugging Face model directory")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VlrlError(f"{config_file} is not valid JSON ({exc}); re-download or rebuild the model") from exc
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise VlrlError(
            f"{path} holds a model of type {model_type!r}; vlrl supports {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def load_policy_model(
    model_dir: str | Path,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """Load a Qwen3-VL (or Qwen2.5-VL) model from a local directory onto `device`.

    `dtype` is "float32", "bfloat16" or "float16". Raises VlrlError for a missing directory,
    a directory that is not a model, or an unsupported architecture.
    """
    if dtype not in DTYPES:
        raise VlrlError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    read_model_config(model_dir)
    try:
        model = AutoModelForImageTextToText.from_pretrained(
            str(model_dir),
            dtype=DTYPES[dtype],
            attn_implementation=attn_implementation,
            local_files_only=True,
        )
    except (OSError, ValueError) as exc:  # missing/corrupt weight files, unknown attention backend
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise VlrlError(f"cannot load model from {model_dir}: {first_line}") from exc
    use_batched_vision(model)  # same outputs, one attention call for all same-size images
    return model.to(device)


def vision_special_token_ids(processor_or_tokenizer) -> list[int]:
    """Ids of the vision placeholder tokens present in the vocabulary; pass as `suppress_tokens`."""
    tokenizer = getattr(processor_or_tokenizer, "tokenizer", processor_or_tokenizer)
    vocab = tokenizer.get_vocab()
    return sorted(vocab[token] for token in VISION_SPECIAL_TOKENS if token in vocab)


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Parameter counts: total, vision (the vision tower incl. its mergers), language (the rest),
    and trainable. Works on a plain model and on a PEFT-wrapped one."""
    total = vision = trainable = 0
    for name, param in model.named_parameters():
        n = param.numel()
        total += n
        if ".visual." in f".{name}":
            vision += n
        if param.requires_grad:
            trainable += n
    return {"total": total, "vision": vision, "language": total - vision, "trainable": trainable}


def count_checkpoint_parameters(model_dir: str | Path) -> dict[str, int]:
    """Parameter counts (total, vision, language) read from the safetensors headers of a model
    directory, without loading any weights: cheap even for an 8B checkpoint."""
    path = Path(model_dir)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise VlrlError(f"{path} has no *.safetensors weight files; vlrl reads safetensors checkpoints only")
    total = vision = 0
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():
                n = 1
                for dim in weights.get_slice(name).get_shape():
                    n *= dim
                total += n
                if ".visual." in f".{name}":
                    vision += n
    return {"total": total, "vision": vision, "language": total - vision}


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute every transformer block's activations in backward (transformers' own gradient
    checkpointing, non-reentrant, so it composes with FSDP2 and frozen base weights); a PEFT
    wrapper is looked through. Forward passes without autograd (rollouts, scoring) are unchanged."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise VlrlError(
            f"{type(base).__name__} does not support gradient checkpointing; set train.gradient_checkpointing=false"
        )
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
