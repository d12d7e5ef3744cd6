"""The transformers rollout engine: batched `generate` with a KV cache, on CPU or GPU.

It drives a PEFT-wrapped Qwen-VL model. In a single process it may share the policy's own module
(`shares_policy=True`): the LoRA weights it samples with are then the ones just trained, and
`update_adapter` only records the version. Otherwise it holds its own copy of the model and loads
the adapter state dict it is given, in memory.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from vlrl.algo.grpo import token_logprobs

from vlrl.rollout.engine import Completion, RolloutEngine, SamplingParams
from vlrl.rollout.sequence import MultimodalSequence, collate


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
        shares_policy: bool = False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.suppress = list(suppress_token_ids)
        self.eos_id = eos_token_id
        self.pad_id = pad_token_id
        self.batch_size = batch_size
        self.shares_policy = shares_policy
        self._version = 0

    @property
    def adapter_version(self) -> int:
        return self._version

    def update_adapter(self, state: dict[str, torch.Tensor], version: int) -> float:
        start = time.perf_counter()
        if not self.shares_policy:
            from vlrl.models.lora import load_adapter_state_dict

            load_adapter_state_dict(self.model, state)
        self._version = version
        return time.perf_counter() - start

    @torch.no_grad()
    def generate(self, prompts: list[MultimodalSequence], params: SamplingParams) -> list[list[Completion]]:
        if params.seed is not None:
            torch.manual_seed(params.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            results: list[list[Completion]] = []
            # Prompts of similar length batch together with less padding; results keep input order.
            order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
            by_index: dict[int, list[Completion]] = {}
            step = max(1, self.batch_size // max(1, params.n))
            for start in range(0, len(order), step):
                chunk = order[start : start + step]
                outs = self._generate_batch([prompts[i] for i in chunk], params)
                for i, comps in zip(chunk, outs):
                    by_index[i] = comps
            results = [by_index[i] for i in range(len(prompts))]
            return results
        finally:
            self.model.train(was_training)

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
        completions: list[list[Completion]] = [[] for _ in prompts]
        for row in range(new_tokens.shape[0]):
            ids = new_tokens[row].tolist()
            finish = "length"
            cut = len(ids)
            for j, t in enumerate(ids):
                if t == self.eos_id:
                    cut, finish = j + 1, "stop"
                    break
            ids = ids[:cut]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if finish == "length" and params.stop and any(s in text for s in params.stop):
                finish = "stop"
            completions[row // params.n].append(Completion(ids, logprobs[row, :cut].tolist(), text, finish))
        return completions

