"""The model factory: tiny offline Qwen3-VL models, loading, processors, fingerprints and LoRA."""

from vlrl.models.fingerprint import model_fingerprint
from vlrl.models.loading import (
    count_checkpoint_parameters,
    count_parameters,
    load_policy_model,
    read_model_config,
    vision_special_token_ids,
)
from vlrl.models.lora import (
    adapter_state_dict,
    apply_lora,
    load_adapter,
    load_adapter_state_dict,
    save_adapter,
)
from vlrl.models.processor import VlrlQwenVLProcessor, load_processor
from vlrl.models.tiny import TINY_SPECS, TinySpec, build_tiny_model

__all__ = [
    "TINY_SPECS",
    "TinySpec",
    "VlrlQwenVLProcessor",
    "adapter_state_dict",
    "apply_lora",
    "build_tiny_model",
    "count_checkpoint_parameters",
    "count_parameters",
    "load_adapter",
    "load_adapter_state_dict",
    "load_policy_model",
    "load_processor",
    "model_fingerprint",
    "read_model_config",
    "save_adapter",
    "vision_special_token_ids",
]
