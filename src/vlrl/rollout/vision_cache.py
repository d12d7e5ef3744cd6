"""Vision-tower outputs kept across the turns of multi-turn rollouts (the fast path's prefill).

The static decoder re-prefills every conversation each turn, and an episode's earlier images
never change: re-collating their pixels (late in a 9x9 maze rollout ~9k images, GBs a turn),
moving them to the device and re-encoding them is repeated work. `VisionFeatureCache` keeps each
image's merged embeddings and deepstack features on the model's device, keyed by the identity of
its pixel tensor: `MultimodalSequence.extend` appends references, so an episode's images are the
same tensor objects every turn, and `_ImageCache` hands the same tensor to identical screens of
other episodes. An entry holds that tensor, so its id cannot be reused by another tensor while the
entry lives. The bound is on feature bytes (device memory), LRU; the key tensors it pins are the
conversations' own host tensors. A prefill touches every image of its batch, so a bound below
(conversations x turns) images' features makes LRU drop what the next turn needs: size it for the
whole rollout (maze9, bfloat16: ~250 KB an image, 512 episodes x 18 turns ~2.3 GB).

Features depend on the vision weights, so `validate` drops everything when the signature changes:
a counter the engine bumps on every `update_adapter`, the model's identity and device, and every vision parameter's
storage, dtype and in-place version counter (an optimizer step or an in-place adapter load bumps it, so
LoRA on the vision tower is never served stale features, with or without `update_adapter`).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any, NamedTuple

import torch

DEFAULT_MB = {"cuda": 4096, "cpu": 256}


class _Entry(NamedTuple):
    pixels: torch.Tensor  # the key tensor, held so that its id stays unique while cached
    embeds: torch.Tensor  # [tokens, hidden] merged image embeddings
    deepstack: tuple[torch.Tensor, ...]  # per deepstack layer [tokens, hidden]
    nbytes: int


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class VisionFeatureCache:
    """Per-image vision features by pixel-tensor identity, LRU, at most `max_bytes` of features."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max(0, int(max_bytes))
        self.bytes = 0
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self.signature: tuple | None = None
        self.hits = self.misses = self.invalidations = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def validate(self, signature: tuple) -> None:
        """Drop every entry when the features they hold may no longer be what the model computes."""
        if signature != self.signature:
            if self.entries:
                self.invalidations += 1
            self.clear()
            self.signature = signature

    def get(self, pixels: torch.Tensor) -> _Entry | None:
        entry = self.entries.get(id(pixels))
        if entry is None or entry.pixels is not pixels:
            return None
        self.entries.move_to_end(id(pixels))
        return entry

    def put(self, pixels: torch.Tensor, embeds: torch.Tensor, deepstack: tuple[torch.Tensor, ...]) -> None:
        size = _nbytes(embeds, *deepstack)
        if size > self.max_bytes:
            return
        old = self.entries.pop(id(pixels), None)
        if old is not None:
            self.bytes -= old.nbytes
        self.entries[id(pixels)] = _Entry(pixels, embeds, deepstack, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= dropped.nbytes


def cached_features_problem(vlm: Any, text: Any) -> str | None:
    """Why this model's prefill cannot be assembled from cached features (None: it can).

    The assembly below is what Qwen3VLModel.forward does with images and no videos; a model
    without the same pieces keeps its own forward."""
    if getattr(vlm, "visual", None) is None or not callable(getattr(vlm, "get_image_features", None)):
        return "the model has no vision tower with get_image_features"
    if getattr(getattr(vlm, "config", None), "image_token_id", None) is None:
        return "the model config has no image_token_id"
    try:
        params = inspect.signature(text.forward).parameters
    except (TypeError, ValueError):
        return "the language model's forward cannot be inspected"
    if not {"inputs_embeds", "visual_pos_masks", "deepstack_visual_embeds"} <= set(params):
        return "the language model takes no deepstack visual embeddings"
    return None


def weights_signature(module: torch.nn.Module) -> tuple:
    """Which tensors a module computes with and whether any was changed in place since."""
    return tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in module.parameters())


def per_image_features(
    out: Any, grids: torch.Tensor, merge: int
) -> tuple[tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    """(embeddings per image, per deepstack layer: features per image) of a `get_image_features` output.

    transformers 5.19 splits both by image; 5.17 (the GPU image's) splits the embeddings only and
    returns each deepstack layer as one [all tokens, hidden] tensor, where indexing by image would take
    a token's row instead. Tensors are split here, so either form works."""
    sizes = (grids.prod(-1) // (merge * merge)).tolist()

    def split(x):
        return tuple(torch.split(x, sizes)) if isinstance(x, torch.Tensor) else tuple(x)

    return split(out.pooler_output), [split(f) for f in out.deepstack_features]


def image_features(
    cache: VisionFeatureCache, vlm: Any, pixels: list[torch.Tensor], grids: torch.Tensor, device: torch.device
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], dict[str, int]]:
    """Embeddings and deepstack features of each image in order: the cached ones looked up, the
    others (each distinct tensor once) encoded in ONE vision-tower call and cached. Also returns
    counts: images, encoded, and bytes of pixels moved to the device."""
    found: dict[int, tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = {}
    todo: dict[int, int] = {}  # id -> index of the first occurrence of each image to encode
    for i, p in enumerate(pixels):
        if id(p) in found or id(p) in todo:
            continue
        entry = cache.get(p) if cache.enabled else None
        if entry is None:
            todo[id(p)] = i
        else:
            found[id(p)] = (entry.embeds, entry.deepstack)
    moved = 0
    if todo:
        index = list(todo.values())
        batch = torch.cat([pixels[i] for i in index], dim=0)
        moved = _nbytes(batch)
        out = vlm.get_image_features(batch.to(device, non_blocking=True), grids[index].to(device), return_dict=True)
        per_embeds, per_layer = per_image_features(out, grids[index], int(vlm.visual.spatial_merge_size))
        for j, i in enumerate(index):
            embeds, deepstack = per_embeds[j], tuple(f[j] for f in per_layer)
            if cache.enabled:
                # Copies, so that an entry does not keep the whole call's feature tensors alive.
                embeds, deepstack = embeds.clone(), tuple(f.clone() for f in deepstack)
                cache.put(pixels[i], embeds, deepstack)
            found[id(pixels[i])] = (embeds, deepstack)
    cache.hits += len(pixels) - len(todo)
    cache.misses += len(todo)
    embeds = [found[id(p)][0] for p in pixels]
    layers = len(found[id(pixels[0])][1]) if pixels else 0
    deepstack = [[found[id(p)][1][k] for p in pixels] for k in range(layers)]
    return embeds, deepstack, {"images": len(pixels), "encoded": len(todo), "pixel_bytes": moved}


def prefill_from_features(
    text: Any,
    lm_head: Any,
    input_ids: torch.Tensor,
    image_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    embeds: list[torch.Tensor],
    deepstack: list[list[torch.Tensor]],
):
    """Qwen3VLModel.forward's image path from given features: token embeddings with the image
    features scattered (in order) onto the image placeholders (`image_mask`, whose count the
    caller checked), deepstack features on the same positions; then the language model (KV cache
    kept) and the LM head on the last position only.
    Returns (last-position logits [B, V], the language model's past_key_values)."""
    inputs_embeds = text.embed_tokens(input_ids)
    visual_pos_masks = deepstack_visual_embeds = None
    if embeds:
        features = torch.cat(embeds, dim=0).to(inputs_embeds.device, inputs_embeds.dtype)
        inputs_embeds = inputs_embeds.masked_scatter(image_mask[..., None], features)
        visual_pos_masks = image_mask
        deepstack_visual_embeds = [torch.cat(layer, dim=0) for layer in deepstack]
    out = text(
        input_ids=None,
        position_ids=position_ids,
        attention_mask=attention_mask,
        inputs_embeds=inputs_embeds,
        use_cache=True,
        visual_pos_masks=visual_pos_masks,
        deepstack_visual_embeds=deepstack_visual_embeds,
    )
    return lm_head(out.last_hidden_state[:, -1]), out.past_key_values
