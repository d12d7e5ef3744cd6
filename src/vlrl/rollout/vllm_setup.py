"""Starting vLLM inside this process, the way vlrl needs it: imported with vlrl's defaults and its
version checked (`import_vllm`), the adapter config vLLM reads from a PEFT model
(`vllm_lora_config`, `vllm_max_lora_rank`), the start-up warnings that say nothing actionable
filtered, and this process's RNG states and torch thread settings kept across vLLM's start-up
(`preserve_process_state`). The engine itself is `vllm_engine.py`.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import numpy as np
import torch

from vlrl.errors import VlrlError
from vlrl.rollout import vllm_compat as compat

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_PEFT_FIELDS = (
    "r",
    "lora_alpha",
    "target_modules",
    "bias",
    "use_rslora",
    "use_dora",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
)


def vllm_lora_config(peft_model: Any) -> dict[str, Any]:
    """The adapter_config.json fields vLLM needs, as plain JSON values, from a PEFT model."""
    config = peft_model.peft_config[peft_model.active_adapter]
    out: dict[str, Any] = {}
    for name in _PEFT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, (set, frozenset, tuple)):
            value = sorted(value)
        if value is not None:
            out[name] = value
    if out.get("use_dora"):
        raise VlrlError("vLLM does not serve DoRA adapters; use plain LoRA with rollout.engine=vllm")
    return out


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts as `max_lora_rank` that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise VlrlError(f"LoRA rank {rank} is larger than vLLM supports ({VLLM_LORA_RANKS[-1]})")


def import_vllm():
    """Import vLLM with vlrl's defaults; environment variables the user set win.

    `VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the engine core in this process: adapters and
    sleep/wake need no IPC, and a CPU engine starts in ~2.5 s instead of ~18 s.
    `VLLM_LOGGING_LEVEL=WARNING`: vLLM logs ~30 INFO lines per start otherwise.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    _quiet_known_vllm_warnings()
    import vllm

    compat.check_vllm_version(vllm.__version__)
    return vllm


# Warnings vLLM prints at every start that say nothing actionable for us: one line per vision-tower
# linear layer (vLLM's LoRA covers the language model only; the engine merges vision LoRA itself),
# the partial weight reloads of that merge on CPU, the CPU build's notes on thread binding (we restore
# torch.set_num_threads), the global seed (we restore the RNG states),
# tcmalloc/iomp preloading, Triton and eager mode. Filters sit on the emitting module loggers,
# because vLLM rebuilds its handlers when an engine starts.
_VLLM_NOISE = (
    "PunicaWrapper",
    "Failed to load weights",
    "were not loaded from checkpoint",
    "Reloading",
    "set_num_threads",
    "LD_PRELOAD",
    "global random seed",
    "VLLM_DIST_IDENT",
    "SSM cache type",
    "Triton",
    "Enforce eager set",
    "Inductor compilation was disabled",
)
_NOISY_LOGGERS = (
    "vllm.lora.model_manager",
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.cpu_worker",
    "vllm.engine.arg_utils",
    "vllm.platforms.cpu",
    "vllm.platforms.interface",
    "vllm.config.vllm",
)


class _DropVllmNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(part in message for part in _VLLM_NOISE)


def _quiet_known_vllm_warnings() -> None:
    """Attach the noise filter to the loggers that print it (once)."""
    for name in _NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropVllmNoise) for f in logger.filters):
            logger.addFilter(_DropVllmNoise())


class preserve_process_state:
    """Keep the global RNG states and torch's thread settings of this process across vLLM's start-up.

    vLLM's in-process CPU worker reseeds Python, NumPy and torch and swaps `torch.set_num_threads`
    for a no-op; the trainer in the same process must not notice either.
    """

    def __enter__(self):
        self.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.set_num_threads = torch.set_num_threads
        self.threads = torch.get_num_threads()
        return self

    def __exit__(self, *exc):
        random.setstate(self.rng[0])
        np.random.set_state(self.rng[1])
        torch.set_rng_state(self.rng[2])
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        torch.set_num_threads = self.set_num_threads
        torch.set_num_threads(self.threads)
        return False
