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

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from vlrl.rollout.sequence import MultimodalSequence


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
    """Generates completions for token prompts with images and serves the current adapter.

    Besides the abstract methods, every hook the worker calls is declared here with the default of
    an engine that holds its own weights and needs no clean-up; an engine overrides what differs.
    """

    name: str = "engine"
    # True: the engine samples with the policy's own module, so a sync sends no weights (it only
    # records the version) and `update_adapter` is called with an empty state.
    shares_policy: bool = False
    # How adapters reach the engine ("memory", or "disk" after a fall-back), reported as
    # `sync/transport_*` step values; None: not reported (an engine that loads in place).
    adapter_transport: str | None = None
    # The PEFT module the engine samples with, when it holds one (the transformers engine); it can
    # write an adapter directory for gathered weights. None: the weights live elsewhere (vLLM).
    model: Any = None
    # "merged": each sync writes W0 + scale * B @ A into the engine's weights, so it wants the
    # adapter on the policy's device (vLLM, `rollout.lora_mode`); "adapter": LoRA applied as such.
    lora_mode: str = "adapter"

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

    def sleep(self) -> None:  # noqa: B027 (optional hook: engines that hold no spare memory keep the no-op)
        """Release memory while the policy trains (engines that cannot: nothing to do)."""

    def wake_up(self) -> None:  # noqa: B027 (optional hook, like sleep)
        """Restore what `sleep` released before the next rollouts."""

    def close(self) -> None:  # noqa: B027 (optional hook: an engine that holds no process or files keeps the no-op)
        """Stop the engine and release what it holds outside Python's memory (processes, files)."""
