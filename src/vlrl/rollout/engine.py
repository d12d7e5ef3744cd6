"""The rollout engine interface: everything that samples from the policy goes through it.

An engine takes token prompts with their images (built by `ChatFormat`, so token ids are exact)
and returns, per prompt, `n` completions with the sampled token ids and their log-probabilities.
After each optimizer step the trainer hands it the new LoRA weights in memory
(`update_adapter`); `adapter_version` says which weights it is serving.

Log-probabilities are those of the distribution actually sampled from: logits divided by the
temperature, with the suppressed (vision special) tokens removed. The policy re-scores sampled
tokens the same way (`vlrl.training.policy`), so the two agree up to float error.
"""

from __future__ import annotations

import importlib.util
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal

import torch

from vlrl.errors import VlrlError
from vlrl.rollout.sequence import MultimodalSequence

log = logging.getLogger(__name__)


@dataclass
class SamplingParams:
    """How to sample one model turn."""

    n: int = 1  # completions per prompt
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    max_new_tokens: int = 32  # token budget of the turn
    stop: list[str] = field(default_factory=list)  # extra stop strings; end-of-turn always stops
    seed: int | None = None  # seeds the sampler of this call (reproducible rollouts)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Completion:
    """One sampled response."""

    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the sampling distribution
    text: str
    finish_reason: Literal["stop", "length"]


class RolloutEngine(ABC):
    """Generates completions for token prompts with images and serves the current adapter."""

    name: str = "engine"

    @abstractmethod
    def generate(self, prompts: list[MultimodalSequence], params: SamplingParams) -> list[list[Completion]]:
        """For each prompt, `params.n` completions."""

    @abstractmethod
    def update_adapter(self, state: dict[str, torch.Tensor], version: int) -> float:
        """Serve these LoRA weights from now on; returns the seconds the sync took."""

    @property
    @abstractmethod
    def adapter_version(self) -> int:
        """Version of the adapter being served (0: the initial adapter)."""

    def sleep(self) -> None:
        """Release memory while the policy trains (engines that cannot: nothing to do)."""

    def wake_up(self) -> None:
        """Restore what `sleep` released before the next rollouts."""


def resolve_engine_name(requested: Literal["auto", "transformers", "vllm"]) -> str:
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
