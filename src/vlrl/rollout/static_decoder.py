"""The static-cache decoder behind the transformers engine's fast path (`fast_decode`).

One prefill forward of the UNIQUE prompts through the model (vision tower, deepstack and M-RoPE
included), its KV cache copied `n` times into a static cache of fixed shape, then every decode
step is the same fixed-shape computation (`StaticDecoder`), replayed as one captured CUDA graph
per step with no host synchronisation until the last token: sampling (Gumbel-max over the
temperature-scaled logits with the vision tokens removed), the sampled token's log-prob, the next
position and the cache write all stay on the GPU. Each layer is recomputed as
Qwen3VLTextDecoderLayer and PEFT's LoRA Linear compute it, from the model's live tensors (base
weights, norm weights, LoRA factors; no copies), so LoRA is applied unmerged: an optimizer step or
an in-place adapter load is seen by the next replay with no merge, unmerge or re-capture. Batches
are padded to a bucket (rows to a power of two, length to a multiple of 64) so few graphs serve
all calls. `compile_step` also compiles the two halves of a layer around the attention (one
Inductor graph each, shared by all layers: ~10 s per batch shape on an H200).

The decoder samples from exactly the distribution the engine's `generate` path samples from
(tested to match it token for token in greedy mode on CPU), but not with the same random numbers.
Figures: bench/RESULTS.md.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from vlrl.models.qwen_vl_batched import forward_inputs, mrope_position_ids, spatial_merge_size
from vlrl.rollout.engine import SamplingParams
from vlrl.rollout.sequence import MultimodalSequence, collate
from vlrl.rollout.vision_cache import (
    DEFAULT_MB,
    VisionFeatureCache,
    cached_features_problem,
    image_features,
    prefill_from_features,
    weights_signature,
)

log = logging.getLogger(__name__)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _cache_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of one layer of a transformers cache, [batch, kv_heads, length, head_dim]."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers[layer].keys, layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


class _Proj(NamedTuple):
    """A linear layer as tensors: base weight/bias and the (unmerged) LoRA factors, if any."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    lora_a: torch.Tensor | None
    lora_b: torch.Tensor | None
    scale: float


class _LayerParts(NamedTuple):
    """The tensors one decoder layer reads (the live parameters, no copies)."""

    input_norm: torch.Tensor
    q: _Proj
    k: _Proj
    v: _Proj
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: _Proj
    post_norm: torch.Tensor
    gate: _Proj
    up: _Proj
    down: _Proj


def _proj_parts(module: Any) -> _Proj:
    """A plain nn.Linear, or a PEFT LoRA layer read as base + one active adapter (no merge)."""
    base = getattr(module, "base_layer", None)
    if base is None:
        return _Proj(module.weight, module.bias, None, None, 0.0)
    active = [a for a in module.active_adapters if a in module.lora_A]
    if module.merged or module.disable_adapters or not active:
        return _Proj(base.weight, base.bias, None, None, 0.0)
    if len(active) > 1:
        raise ValueError("the static decoder serves one active LoRA adapter")
    name = active[0]
    return _Proj(
        base.weight, base.bias, module.lora_A[name].weight, module.lora_B[name].weight, float(module.scaling[name])
    )


def _linear(x: torch.Tensor, p: _Proj) -> torch.Tensor:
    """What PEFT's LoRA Linear computes in eval: base(x) + B(A(x in the adapter's dtype)) * scale."""
    out = F.linear(x, p.weight, p.bias)
    if p.lora_a is None:
        return out
    return (out + F.linear(F.linear(x.to(p.lora_a.dtype), p.lora_a), p.lora_b) * p.scale).to(out.dtype)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3VLTextRMSNorm: normalise in float32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _attention_inputs(hidden, w: _LayerParts, cos, sin, eps: float, kv_heads: int, head_dim: int):
    """Input norm, q/k/v projections, q/k norms and rotary embedding of one new token per row."""
    rows = hidden.shape[0]
    x = _rms_norm(hidden, w.input_norm, eps)
    q = _rms_norm(_linear(x, w.q).view(rows, 1, -1, head_dim), w.q_norm, eps).transpose(1, 2)
    k = _rms_norm(_linear(x, w.k).view(rows, 1, -1, head_dim), w.k_norm, eps).transpose(1, 2)
    v = _linear(x, w.v).view(rows, 1, -1, head_dim).transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    # Grouped-query attention without repeating the cache: the query heads that share a KV head
    # (heads kv*groups .. kv*groups+groups-1) become `groups` queries of that head.
    return q.reshape(rows, kv_heads, -1, head_dim), k, v


def _attention_output_and_mlp(hidden, attn, w: _LayerParts, eps: float):
    """Output projection and residual, then the SwiGLU MLP and residual."""
    hidden = hidden + _linear(attn.reshape(hidden.shape[0], 1, -1), w.o)
    x = _rms_norm(hidden, w.post_norm, eps)
    return hidden + _linear(F.silu(_linear(x, w.gate)) * _linear(x, w.up), w.down)


def make_sampler(greedy: bool, temperature: float, banned: torch.Tensor | None) -> Callable:
    """logits [B, V] -> (token [B], log-prob [B] float32) without any host synchronisation.

    Samples softmax((logits / temperature) with `banned` ids at -inf) by the Gumbel-max trick
    (argmax of log p - log E, E ~ Exp(1)); greedy takes the argmax. The log-prob is that of the
    distribution sampled from, as `vlrl.algo.grpo.token_logprobs` computes it.
    """

    def sample(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = logits.float()
        if not greedy and temperature != 1.0:
            z = z / temperature
        if banned is not None:
            z = z.index_fill(-1, banned, float("-inf"))
        logp = torch.log_softmax(z, dim=-1)
        if greedy:
            token = z.argmax(dim=-1)
        else:
            token = (logp - torch.empty_like(logp).exponential_().log()).argmax(dim=-1)
        return token, logp.gather(-1, token[:, None]).squeeze(-1)

    return sample


@dataclass
class _DecodeState:
    """Static buffers of one (rows, length, sampler) shape, and the graph that replays a step on them."""

    k: list[torch.Tensor]  # per layer [B, kv_heads, L, head_dim]
    v: list[torch.Tensor]
    tokens: torch.Tensor  # [B] the token fed to the next step
    start_pos: torch.Tensor  # [B] M-RoPE position of the first generated token
    prompt_len: torch.Tensor  # [1] padded prompt length P: generated token t is cached at P + t
    step: torch.Tensor  # [1] decode steps done
    prompt_valid: torch.Tensor  # [B, L] True on real (not padding) prompt positions
    positions: torch.Tensor  # [L] 0..L-1
    out_tokens: torch.Tensor  # [B, L] sampled tokens, column t = generated token t
    out_logprobs: torch.Tensor  # [B, L]
    sampler: Callable
    parts: list[_LayerParts] = field(default_factory=list)  # the tensors a captured graph reads
    graph: Any = None
    signature: tuple = field(default_factory=tuple)


class StaticDecoder:
    """Prefill with the model, then fixed-shape decode steps over a static KV cache.

    Works on Qwen3-VL text models (q/k norms, M-RoPE); `unsupported` says why another model
    cannot use it. On CUDA each step is captured once as a CUDA graph and replayed.
    """

    max_states = 3  # cached shapes (each holds a KV cache and a graph); the least recently used is dropped
    bucket_rows_on_cpu = False  # tests: pad rows to a bucket on CPU too, as on CUDA

    def __init__(self, model: Any, compile_step: bool = False, vision_cache_mb: int | None = None):
        self.model = model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.vlm = base.model
        self.text = base.model.language_model
        self.lm_head = base.lm_head
        cfg = self.text.config
        self.layers = list(self.text.layers)
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = float(self.layers[0].input_layernorm.variance_epsilon)
        self.merge_size = spatial_merge_size(base)
        self.use_graphs = True
        self.states: OrderedDict[tuple, _DecodeState] = OrderedDict()
        self.step_fn: Callable = self._step
        self.compile_step = compile_step
        self.attention_inputs: Callable = _attention_inputs
        self.attention_output_and_mlp: Callable = _attention_output_and_mlp
        if compile_step:
            # The layer halves around the cache write and attention, with the weights as inputs:
            # one compiled graph per half serves all layers (only shapes are guarded).
            self.attention_inputs = torch.compile(_attention_inputs, dynamic=False)
            self.attention_output_and_mlp = torch.compile(_attention_output_and_mlp, dynamic=False)
        device = next(model.parameters()).device
        mb = DEFAULT_MB.get(device.type, DEFAULT_MB["cpu"]) if vision_cache_mb is None else vision_cache_mb
        self.vision_cache = VisionFeatureCache(mb << 20)
        self.weights_updates = 0  # bumped by the engine's update_adapter: cached features are dropped
        self.vision_stats: dict[str, int] = {}  # images, encoded, pixel_bytes of the last prefill
        self._cache_problem = cached_features_problem(self.vlm, self.text)
        if self.vision_cache.enabled and self._cache_problem:
            log.warning("vision features are not cached (%s): every prefill encodes every image", self._cache_problem)

    @staticmethod
    def unsupported(model: Any) -> str | None:
        """Why this model cannot use the static decoder, or None."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = getattr(base, "config", None)
        if getattr(config, "model_type", None) != "qwen3_vl":
            return f"the static decoder supports Qwen3-VL only (model type {getattr(config, 'model_type', None)!r})"
        attn = base.model.language_model.layers[0].self_attn
        if not (hasattr(attn, "q_norm") and hasattr(attn, "k_norm")):
            return "the language model's attention has no q/k norms"
        if getattr(base.model.language_model.config, "hidden_act", "silu") != "silu":
            return "the static decoder implements the SiLU MLP only"
        lora_layers = [m for m in base.modules() if hasattr(m, "lora_A")]
        if any(getattr(m, "lora_variant", None) for m in lora_layers):
            return "LoRA variants (DoRA, ...) are not supported by the static decoder"
        if any(len([a for a in m.active_adapters if a in m.lora_A]) > 1 for m in lora_layers):
            return "the static decoder serves one active LoRA adapter"
        return None

    # -- one call ------------------------------------------------------------------------
    def generate(
        self, prompts: list[MultimodalSequence], params: SamplingParams, banned: list[int], pad_id: int
    ) -> tuple[list[list[int]], list[list[float]], dict[str, float]]:
        """Sampled tokens and log-probs, `params.n` rows per prompt (prompt-major), and phase timings."""
        device = next(self.model.parameters()).device
        cuda = device.type == "cuda"
        n, new = params.n, params.max_new_tokens
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        first_logits, kv, attention_mask, next_pos = self._prefill(prompts, pad_id, device)
        rows, prompt_len = len(prompts) * n, attention_mask.shape[1]
        length = _round_up(prompt_len + new, 64)
        padded_rows = max(8, 1 << (rows - 1).bit_length()) if cuda or self.bucket_rows_on_cpu else rows
        greedy = params.greedy
        temperature = 1.0 if greedy else params.temperature
        key = (padded_rows, greedy, temperature, tuple(banned), str(device))
        state = self._state(
            key,
            padded_rows,
            length,
            device,
            kv[0][0].dtype,
            make_sampler(
                greedy, temperature, torch.tensor(banned, device=device, dtype=torch.long) if banned else None
            ),
        )
        if cuda:
            torch.cuda.synchronize(device)
        timings["prefill_s"] = time.perf_counter() - t0

        t1 = time.perf_counter()
        if cuda and state.graph is None and self.use_graphs:
            try:
                self._capture(state)
            except Exception as exc:  # e.g. an op that synchronises: decode eagerly instead
                log.warning("CUDA graph capture of the decode step failed (%s); decoding without graphs", exc)
                self.use_graphs = False
                state.graph = None
        timings["capture_s"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        # Row r of the batch is sample r % n of prompt r // n; padding rows repeat prompt 0.
        row = torch.arange(padded_rows, device=device)
        src = torch.where(row < rows, row // n, torch.zeros_like(row))
        for layer, (keys, values) in enumerate(kv):
            state.k[layer][:, :, :prompt_len].copy_(keys.index_select(0, src))
            state.v[layer][:, :, :prompt_len].copy_(values.index_select(0, src))
        state.prompt_valid.zero_()
        state.prompt_valid[:, :prompt_len] = attention_mask.bool().index_select(0, src)
        state.start_pos.copy_(next_pos.index_select(0, src))
        state.prompt_len.fill_(prompt_len)
        state.step.zero_()
        token, logprob = state.sampler(first_logits.index_select(0, src))
        state.tokens.copy_(token)
        state.out_tokens[:, 0] = token
        state.out_logprobs[:, 0] = logprob
        for _ in range(new - 1):
            if state.graph is not None:
                state.graph.replay()
            else:
                self.step_fn(state)
        tokens = state.out_tokens[:rows, :new].tolist()  # the one host synchronisation
        logprobs = state.out_logprobs[:rows, :new].tolist()
        timings["decode_s"] = time.perf_counter() - t2
        return tokens, logprobs, timings

    def _prefill(self, prompts: list[MultimodalSequence], pad_id: int, device: torch.device):
        """One forward over the unique prompts: last-position logits, the per-layer KV cache, the
        attention mask and each prompt's next M-RoPE position (positions as `generate` makes them)."""
        cached = self.vision_cache.enabled and self._cache_problem is None
        batch = collate(prompts, pad_id, side="left", pixels=not cached)
        rope = mrope_position_ids(batch, self.merge_size)  # on the CPU batch: no per-image loop or sync
        if cached and rope is None and "image_grid_thw" in batch:
            cached = False  # videos, or not Qwen3-VL's M-RoPE: the model's own forward, with all pixels
            batch = collate(prompts, pad_id, side="left")
        inputs = forward_inputs(batch, device, None)
        mask = inputs["attention_mask"]
        text_pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        if rope is not None:
            rope = rope.to(device)
        elif "pixel_values" in batch:  # not Qwen3-VL's M-RoPE: the model's own computation
            rope, _ = self.vlm.get_rope_index(
                inputs["input_ids"],
                mm_token_type_ids=inputs["mm_token_type_ids"],
                image_grid_thw=inputs["image_grid_thw"],
                attention_mask=mask,
            )
        else:
            rope = text_pos[None].expand(3, -1, -1)
        # Padding positions hold 0, so the row max is the last real token's position.
        next_pos = rope.amax(dim=(0, 2)) + 1
        position_ids = torch.cat([text_pos[None], rope], dim=0)
        if cached:
            logits, past = self._prefill_cached(prompts, batch, inputs, position_ids, device)
        else:
            out = self.model(**inputs, position_ids=position_ids, use_cache=True, logits_to_keep=1)
            logits, past = out.logits[:, -1], out.past_key_values
            pixels = batch.get("pixel_values")
            count = len(batch.get("image_grid_thw", ()))
            self.vision_stats = {
                "images": count,
                "encoded": count,
                "pixel_bytes": 0 if pixels is None else pixels.numel() * pixels.element_size(),
            }
        kv = [_cache_kv(past, i) for i in range(len(self.layers))]
        return logits, kv, mask, next_pos

    def _prefill_cached(self, prompts, batch, inputs, position_ids, device):
        """The prefill with each image's vision features from the cache, or encoded now (new images only)."""
        self.vision_cache.validate(
            (self.weights_updates, id(self.model), str(device), weights_signature(self.vlm.visual))
        )
        pixels = [p for s in prompts for p in s.pixel_values]
        image_mask = batch["input_ids"] == self.vlm.config.image_token_id
        embeds: list[torch.Tensor] = []
        deepstack: list[list[torch.Tensor]] = []
        self.vision_stats = {"images": 0, "encoded": 0, "pixel_bytes": 0}
        if pixels:
            grids = batch["image_grid_thw"]
            expected = int((grids.prod(-1) // self.merge_size**2).sum())
            if int(image_mask.sum()) != expected:  # checked on the CPU batch: no device sync
                raise ValueError(f"image tokens ({int(image_mask.sum())}) and image features ({expected}) do not match")
            embeds, deepstack, self.vision_stats = image_features(self.vision_cache, self.vlm, pixels, grids, device)
        return prefill_from_features(
            self.text,
            self.lm_head,
            inputs["input_ids"],
            image_mask.to(device),
            inputs["attention_mask"],
            position_ids,
            embeds,
            deepstack,
        )

    # -- static state and graphs ------------------------------------------------------------
    def _layer_parts(self) -> list[_LayerParts]:
        """The live tensors of every layer, read from the modules now (LoRA unmerged)."""
        parts = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            parts.append(
                _LayerParts(
                    layer.input_layernorm.weight,
                    _proj_parts(attn.q_proj),
                    _proj_parts(attn.k_proj),
                    _proj_parts(attn.v_proj),
                    attn.q_norm.weight,
                    attn.k_norm.weight,
                    _proj_parts(attn.o_proj),
                    layer.post_attention_layernorm.weight,
                    _proj_parts(mlp.gate_proj),
                    _proj_parts(mlp.up_proj),
                    _proj_parts(mlp.down_proj),
                )
            )
        return parts

    @staticmethod
    def _signature(parts: list[_LayerParts]) -> tuple:
        """Which tensors (by storage) and which LoRA factors a step reads: a moved or replaced
        weight, or a merged/disabled adapter, needs a new graph."""
        out = []
        for layer in parts:
            for item in layer:
                for t in item if isinstance(item, _Proj) else (item,):
                    out.append(t.data_ptr() if isinstance(t, torch.Tensor) else t)
        return tuple(out)

    def _state(
        self, key: tuple, rows: int, length: int, device: torch.device, dtype: torch.dtype, sampler: Callable
    ) -> _DecodeState:
        """A cached state for `key` (rows, sampler, device) whose length fits `length` (up to twice
        as long: a longer cache only costs attention reads), else a new one."""
        parts = self._layer_parts()
        signature = self._signature(parts) + (self.lm_head.weight.data_ptr(),)
        fits = [
            (k, st)
            for k, st in self.states.items()
            if k[0] == key and length <= k[1] <= 2 * length and st.signature == signature
        ]
        if fits:
            found, state = min(fits, key=lambda item: item[0][1])
            self.states.move_to_end(found)
            return state
        self.states.pop((key, length), None)
        while len(self.states) >= self.max_states:
            self.states.popitem(last=False)
        shape = (rows, self.kv_heads, length, self.head_dim)
        state = _DecodeState(
            k=[torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers],
            v=[torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers],
            tokens=torch.zeros(rows, dtype=torch.long, device=device),
            start_pos=torch.zeros(rows, dtype=torch.long, device=device),
            prompt_len=torch.zeros(1, dtype=torch.long, device=device),
            step=torch.zeros(1, dtype=torch.long, device=device),
            prompt_valid=torch.zeros(rows, length, dtype=torch.bool, device=device),
            positions=torch.arange(length, device=device),
            out_tokens=torch.zeros(rows, length, dtype=torch.long, device=device),
            out_logprobs=torch.zeros(rows, length, dtype=torch.float32, device=device),
            sampler=sampler,
            parts=parts,
            signature=signature,
        )
        self.states[(key, length)] = state
        return state

    def _capture(self, state: _DecodeState) -> None:
        """Record one decode step as a CUDA graph (after warm-up steps on a side stream)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3 if self.compile_step else 2):  # lazy init, cuBLAS workspaces, compilation
                self.step_fn(state)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step_fn(state)
        state.graph = graph

    # -- one decode step (fixed shapes, no host synchronisation) -----------------------------
    def _step(self, st: _DecodeState) -> None:
        """Feed `st.tokens`, cache their keys/values, sample the next tokens; advance `st.step`."""
        pos = st.start_pos + st.step  # [B]
        write_at = st.prompt_len + st.step  # [1]
        mask = st.prompt_valid | ((st.positions >= st.prompt_len) & (st.positions <= write_at))
        mask = mask[:, None, None, :]  # [B, 1, 1, L]: the same for every head and query
        hidden = self.text.embed_tokens(st.tokens[:, None])  # [B, 1, H]
        # Generated tokens are text: the same position on the t, h and w axes of M-RoPE.
        cos, sin = self.text.rotary_emb(hidden, pos.view(1, -1, 1).expand(3, -1, -1))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, 1, D]
        for w, k_cache, v_cache in zip(st.parts, st.k, st.v):
            q, k, v = self.attention_inputs(hidden, w, cos, sin, self.eps, self.kv_heads, self.head_dim)
            k_cache.index_copy_(2, write_at, k)
            v_cache.index_copy_(2, write_at, v)
            attn = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, scale=self.head_dim**-0.5)
            hidden = self.attention_output_and_mlp(hidden, attn, w, self.eps)
        logits = self.lm_head(self.text.norm(hidden))[:, 0]
        token, logprob = st.sampler(logits)
        st.out_tokens.index_copy_(1, st.step + 1, token[:, None])
        st.out_logprobs.index_copy_(1, st.step + 1, logprob[:, None])
        st.tokens.copy_(token)
        st.step.add_(1)
