"""What the run's config makes of the rollout: which engine samples, and how.

`build_engine` is the one constructor of rollout engines (the worker, the evaluation protocol and
the benchmarks call it): `resolve_engine_name` picks the engine (`rollout.engine`: auto,
transformers or vllm) and checks that vLLM imports when it is asked for, and `rollout.*` sizes it.
`sampling_params` turns `rollout.*` into the `SamplingParams` of training rollouts or greedy
evaluation. The choice lives here, above both engines, so the engine interface (`engine.py`) never
imports an implementation of itself; vLLM is imported only when it is chosen.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any, Literal

import torch

from vlrl.config import RunConfig
from vlrl.errors import VlrlError
from vlrl.rollout.engine import RolloutEngine, SamplingParams
from vlrl.rollout.lora_mode import resolve_lora_mode, resolve_sleep_level
from vlrl.rollout.sequence import ChatFormat

log = logging.getLogger(__name__)

EngineName = Literal["auto", "transformers", "vllm"]

# Left free on the GPU beside the policy's weights and vLLM's share: the policy's activations during
# rollouts' host work, NCCL buffers, allocator slack. The update runs while vLLM sleeps.
POLICY_HEADROOM_BYTES = 4 << 30


def build_engine(
    config: RunConfig,
    chat: ChatFormat,
    model: Any,
    *,
    engine: EngineName | None = None,
    shares_policy: bool = False,
    model_dir: str | os.PathLike | None = None,
    gpu_memory_utilization: float | None = None,
    world_size: int = 1,
    **engine_args: Any,
) -> RolloutEngine:
    """The rollout engine `engine` (default: the config's `rollout.engine`, resolved), sized by `rollout.*`.

        `chat` gives the tokenizer, the end-of-turn and padding ids; the vision special tokens of its
        processor are never sampled. `model` is the PEFT-wrapped model to sample from: the
        transformers engine runs it (with `shares_policy`, it is the policy being trained, so a sync
        only records the version); vLLM reads only its adapter config and loads the base weights
        from `model_dir` (default: `config.model`'s directory), never sharing the policy's module; its
        first adapter comes with the caller's first `update_adapter`. `gpu_memory_utilization`: vLLM's
        share of the GPU (default: `rollout.gpu_memory_utilization` against the memory free now,
        `vllm_memory_share`; unused on CPU). `world_size`: workers of the policy (vLLM's sleep level,
    `resolve_sleep_level`). `engine_args`: constructor arguments of the engine that
        override the config's (benchmarks: `ignore_eos`, `max_num_seqs`, `extra_args`, ...; the worker:
        `base_source`, where a merging vLLM engine reads W0, and `base_resident`, whether it yields
        the same tensors every time).
    """
    from vlrl.models.loading import vision_special_token_ids

    name = resolve_engine_name(engine or config.rollout.engine)
    r = config.rollout
    lora_mode = resolve_lora_mode(r.lora_mode, name, config.runtime.use_gpu)  # a misfit mode is one error line
    suppress = vision_special_token_ids(chat.processor)
    if name == "vllm":
        from vlrl.models.loading import ensure_model, worker_device
        from vlrl.rollout.vllm_engine import VLLMEngine, vllm_lora_config

        if gpu_memory_utilization is None:
            gpu_memory_utilization = 0.5  # unused on CPU (the KV cache is sized by rollout.kv_cache_memory_mb)
            if config.runtime.use_gpu:
                free, total = torch.cuda.mem_get_info(worker_device(config))
                gpu_memory_utilization = vllm_memory_share(r.gpu_memory_utilization, free, total)
        kwargs: dict[str, Any] = dict(
            eos_token_id=chat.eos_id,
            lora_config=vllm_lora_config(model),
            dtype=config.model.dtype,
            max_model_len=r.max_model_len,
            max_images=config.env.max_turns,  # one image per turn
            max_num_seqs=r.batch_size,
            kv_cache_memory_mb=r.kv_cache_memory_mb,
            gpu_memory_utilization=gpu_memory_utilization,
            use_gpu=config.runtime.use_gpu,
            seed=config.train.seed,
            lora_mode=lora_mode,
            lora_compute_dtype=config.model.lora.compute_dtype,
            sleep_level=resolve_sleep_level(r.sleep_level, lora_mode, config.runtime.use_gpu, world_size),
            sleep_unmap=r.sleep_unmap,
        )
        directory = model_dir if model_dir is not None else ensure_model(config.model)
        return VLLMEngine(directory, chat.tokenizer, suppress, **{**kwargs, **engine_args})
    from vlrl.rollout.hf_engine import TransformersEngine

    kwargs = dict(
        eos_token_id=chat.eos_id,
        pad_token_id=chat.pad_id,
        batch_size=r.batch_size,
        max_batch_tokens=r.max_batch_tokens,
        shares_policy=shares_policy,
        fast_decode=r.fast_decode,
        compile_decode=r.compile_decode,
        vision_cache_mb=r.vision_cache_mb,
    )
    return TransformersEngine(model, chat.tokenizer, suppress, **{**kwargs, **engine_args})


def vllm_memory_share(requested: float | str, free: int, total: int) -> float:
    """The `gpu_memory_utilization` to start vLLM with, next to a policy already on the GPU
    (`free`/`total`: bytes, from `torch.cuda.mem_get_info` after the policy is loaded).

    vLLM claims that share of the GPU's TOTAL memory and refuses to start when less is free, so a
    share that leaves no room for the policy is an error here, with both numbers, before vLLM
    allocates anything. `auto`: everything free after the policy, less `POLICY_HEADROOM_BYTES`.
    """
    usable = free - POLICY_HEADROOM_BYTES
    gib = 2**30
    if requested == "auto":
        share = usable / total
        if share < 0.05:
            raise VlrlError(
                f"rollout.gpu_memory_utilization=auto: only {free / gib:.1f} GiB of the GPU's {total / gib:.1f} GiB "
                "are free after loading the policy; too little for a vLLM engine beside it"
            )
        return round(share, 3)
    share = float(requested)
    if share * total > usable:
        raise VlrlError(
            f"rollout.gpu_memory_utilization={share} asks vLLM for {share * total / gib:.1f} GiB of the GPU's "
            f"{total / gib:.1f} GiB, but only {free / gib:.1f} GiB are free after loading the policy, "
            f"{POLICY_HEADROOM_BYTES // gib} GiB of which stay with the policy; "
            f"use at most {max(0.0, usable / total):.2f}, or auto"
        )
    return share


def sampling_params(config: RunConfig, greedy: bool = False, seed: int | None = None) -> SamplingParams:
    """Sampling of training rollouts (or greedy decoding) from the run's config."""
    r = config.rollout
    return SamplingParams(
        temperature=0.0 if greedy else r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens, seed=seed
    )


def resolve_engine_name(requested: EngineName) -> str:
    """`auto` means vLLM where it imports, else transformers; asking for a missing (or broken) vLLM is an error."""
    if requested not in ("auto", "transformers", "vllm"):
        raise VlrlError(f"unknown rollout.engine {requested!r}; choose auto, transformers or vllm")
    if requested == "transformers":
        return requested
    problem = _vllm_problem()
    if requested == "auto":
        if problem and importlib.util.find_spec("vllm") is not None:
            log.warning("rollout.engine=auto: %s, so the transformers engine is used", problem)
        return "transformers" if problem else "vllm"
    if problem:
        raise VlrlError(
            f"rollout.engine is 'vllm' but {problem}; install it (CPU: scripts/setup-vllm-venv.sh, "
            "see docs/vllm.md) or set rollout.engine=transformers"
        )
    return requested


def _vllm_problem() -> str | None:
    """Why vLLM cannot be used here (not installed, or fails to import), or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    try:
        from vlrl.rollout.vllm_engine import import_vllm

        import_vllm()  # the engine needs it anyway; a broken install shows up here
    except VlrlError as exc:  # e.g. a version outside the supported range: its own line says it
        return str(exc)
    except Exception as exc:  # e.g. a torchvision without its C++ ops
        lines = str(exc).strip().splitlines()
        return f"vLLM does not import ({type(exc).__name__}: {lines[0] if lines else ''})"
    return None
