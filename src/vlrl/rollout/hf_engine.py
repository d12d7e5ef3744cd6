"""The transformers rollout engine: batched `generate` with a KV cache, on CPU or GPU.

It drives a PEFT-wrapped Qwen-VL model. In a single process it may share the policy's own module
(`shares_policy=True`): the LoRA weights it samples with are then the ones just trained, and
`update_adapter` only records the version. Otherwise it holds its own copy of the model and loads
the adapter state dict it is given, in memory.

Two decoding paths:

- `generate` path (the default on CPU): transformers' `model.generate`. Its tokens and log-probs
  are what the rest of the project's CPU tests pin down.
- fast path (`fast_decode`, the default on CUDA; for GPUs without vLLM): a prefill, then
  fixed-shape decode steps over a static KV cache replayed as CUDA graphs, LoRA unmerged
  (`vlrl.rollout.static_decoder`). It samples from exactly the distribution the generate path
  samples from, but not with the same random numbers.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

import torch

from vlrl.algo.grpo import token_logprobs
from vlrl.rollout.engine import Completion, RolloutEngine, SamplingParams
from vlrl.rollout.sequence import MultimodalSequence, collate
from vlrl.rollout.static_decoder import StaticDecoder

log = logging.getLogger(__name__)

FastDecode = bool | Literal["auto"]


class TransformersEngine(RolloutEngine):
    name = "transformers"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        suppress_token_ids: list[int],
        *,
        eos_token_id: int,
        pad_token_id: int,
        batch_size: int = 64,
        max_batch_tokens: int | None = None,
        shares_policy: bool = False,
        fast_decode: FastDecode = "auto",
        compile_decode: bool = False,
        ignore_eos: bool = False,
        vision_cache_mb: int | None = None,
    ):
        """`fast_decode`: "auto" uses the static-cache decoder on CUDA and `generate` elsewhere; True
        uses it wherever it can (eagerly on CPU); False always uses `generate`. `compile_decode`
        additionally compiles the decode step with torch.compile (CUDA; costs a compile per shape).
        `max_batch_tokens`: most prompt tokens (rows x longest, padding included) one prefill
        holds; a call over it runs in several batches. `ignore_eos` (benchmarks): every completion
        is exactly max_new_tokens long, the end-of-turn token is never sampled. `vision_cache_mb`
        (fast path): MiB of vision-tower outputs kept across calls so each turn encodes only new
        images (`vlrl.rollout.vision_cache`); None: 4096 on CUDA, 256 elsewhere; 0: off."""
        if fast_decode not in (True, False, "auto"):
            raise ValueError(f"fast_decode must be True, False or 'auto', got {fast_decode!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.suppress = list(suppress_token_ids)
        self.eos_id = eos_token_id
        self.pad_id = pad_token_id
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.shares_policy = shares_policy
        self.fast_decode = fast_decode
        self.compile_decode = compile_decode
        self.ignore_eos = ignore_eos
        self.vision_cache_mb = vision_cache_mb
        self.timings: dict[str, float] = {}  # seconds spent in the last generate call, by phase
        self._version = 0
        self._decoder: StaticDecoder | None = None
        self._warned: set[str] = set()

    @property
    def adapter_version(self) -> int:
        return self._version

    def update_adapter(self, state: dict[str, torch.Tensor], version: int) -> float:
        start = time.perf_counter()
        if not self.shares_policy:
            from vlrl.models.lora import load_adapter_state_dict

            # In place: a captured decode graph keeps reading the same adapter tensors.
            load_adapter_state_dict(self.model, state)
        self._version = version
        if self._decoder is not None:  # LoRA on the vision tower changes its outputs
            self._decoder.weights_updates += 1
        return time.perf_counter() - start

    def sleep(self) -> None:
        """Drop the vision features kept across a rollout's turns before the policy trains: the
        update changes the vision weights they came from (LoRA on the vision tower), and their
        memory (16 GiB in gpu-maze9) is the update's to use: a GRPO update on an H200 does not fit
        beside them. The decode buffers and graphs stay: re-capturing them every step would cost
        seconds."""
        if self._decoder is not None:
            self._decoder.vision_cache.clear()

    @torch.no_grad()
    def generate(self, prompts: list[MultimodalSequence], params: SamplingParams) -> list[list[Completion]]:
        if params.seed is not None:
            torch.manual_seed(params.seed)
        self.timings = {}
        fast = self._use_fast_path(params)
        was_training = self.model.training
        self.model.eval()
        try:
            results: list[list[Completion]] = []
            # Prompts of similar length batch together with less padding; results keep input order.
            order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
            by_index: dict[int, list[Completion]] = {}
            for chunk in self._batches(order, [len(p) for p in prompts], params.n):
                batch = [prompts[i] for i in chunk]
                outs = self._fast_generate_batch(batch, params) if fast else self._generate_batch(batch, params)
                for i, comps in zip(chunk, outs):
                    by_index[i] = comps
            results = [by_index[i] for i in range(len(prompts))]
            return results
        finally:
            self.model.train(was_training)

    def _batches(self, order: list[int], lengths: list[int], n: int) -> list[list[int]]:
        """`order` (prompt indices, shortest first) cut into generate batches: at most batch_size
        rows (n per prompt) and, with max_batch_tokens, at most that many padded prompt tokens
        (a prompt longer than the budget alone still goes, alone)."""
        per_batch = max(1, self.batch_size // max(1, n))
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            # Sorted by length, so the prompt being added is the batch's longest.
            over_tokens = self.max_batch_tokens is not None and (len(current) + 1) * lengths[i] > self.max_batch_tokens
            if current and (len(current) == per_batch or over_tokens):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    # -- the generate path ------------------------------------------------------------------
    def _generate_batch(self, prompts: list[MultimodalSequence], params: SamplingParams) -> list[list[Completion]]:
        batch = collate(prompts, self.pad_id, side="left")
        device = next(self.model.parameters()).device
        inputs = {k: v.to(device) for k, v in batch.items() if k not in ("loss_mask", "sample_logprobs")}
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.n,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            suppress_tokens=self.suppress or None,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if self.ignore_eos:
            gen_kwargs["min_new_tokens"] = params.max_new_tokens
        if params.greedy:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            gen_kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
        if params.stop:
            gen_kwargs.update(stop_strings=params.stop, tokenizer=self.tokenizer)
        out = self.model.generate(**inputs, **gen_kwargs)
        prompt_len = inputs["input_ids"].shape[1]
        new_tokens = out.sequences[:, prompt_len:]
        logits = torch.stack(out.logits, dim=1).float()  # [B*n, new, V], before any processor
        temperature = 1.0 if params.greedy else params.temperature
        logprobs = token_logprobs(logits, new_tokens, temperature, self.suppress)
        return self._completions(new_tokens.tolist(), logprobs.tolist(), len(prompts), params)

    def _completions(
        self, tokens: list[list[int]], logprobs: list[list[float]], n_prompts: int, params: SamplingParams
    ) -> list[list[Completion]]:
        """Rows of sampled tokens (prompt-major, `params.n` per prompt) cut at the first end-of-turn."""
        completions: list[list[Completion]] = [[] for _ in range(n_prompts)]
        for row, (ids, lps) in enumerate(zip(tokens, logprobs)):
            finish = "length"
            cut = len(ids)
            if not self.ignore_eos:
                for j, t in enumerate(ids):
                    if t == self.eos_id:
                        cut, finish = j + 1, "stop"
                        break
            ids = ids[:cut]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if finish == "length" and params.stop and any(s in text for s in params.stop):
                finish = "stop"
            completions[row // params.n].append(Completion(ids, lps[:cut], text, finish))
        return completions

    # -- the fast path ----------------------------------------------------------------------
    def _use_fast_path(self, params: SamplingParams) -> bool:
        if self.fast_decode is False:
            return False
        device = next(self.model.parameters()).device
        if self.fast_decode == "auto" and device.type != "cuda":
            return False
        reason = None
        if params.stop:
            reason = "stop strings need the generate path"
        elif not params.greedy and params.top_p < 1.0:
            reason = "top_p < 1 needs the generate path"
        else:
            reason = StaticDecoder.unsupported(self.model)
        if reason:
            if reason not in self._warned:
                self._warned.add(reason)
                log.warning("fast decoding is off for this call: %s", reason)
            return False
        return True

    def _fast_generate_batch(self, prompts: list[MultimodalSequence], params: SamplingParams) -> list[list[Completion]]:
        if self._decoder is None:
            self._decoder = StaticDecoder(
                self.model, compile_step=self.compile_decode, vision_cache_mb=self.vision_cache_mb
            )
        banned = list(self.suppress) + ([self.eos_id] if self.ignore_eos else [])
        tokens, logprobs, timings = self._decoder.generate(prompts, params, banned, self.pad_id)
        for k, v in timings.items():
            self.timings[k] = self.timings.get(k, 0.0) + v
        return self._completions(tokens, logprobs, len(prompts), params)
