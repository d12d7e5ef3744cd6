"""Qwen3-VL forwards over batches of many images without a Python loop per image.

A multi-turn episode carries one image per turn, so a GRPO batch of 512 nine-by-nine maze
episodes holds ~7,700 images. transformers' Qwen3-VL handles each image in Python: its M-RoPE
positions (`get_rope_index`: a loop over sequences and images with a `.item()` host sync per
image), the vision rotary positions (one `meshgrid` per image) and, outside flash attention, the
vision attention (`torch.split` by image, one sdpa call each). On a GPU those are tens of
thousands of tiny kernels and syncs per forward, more than the model's own arithmetic for the
tiny maze models. Two replacements, each exact where it applies and the stock code elsewhere:

- `mrope_position_ids`: the M-RoPE position ids `get_rope_index` computes, in one vectorised pass
  over the CPU batch (so no device sync at all). Callers pass them as `position_ids`, which the
  model then uses instead of computing its own. Images only (videos: None, the model computes).
- `use_batched_vision(model)`: the vision tower runs the attention of same-size images as ONE
  sdpa call over `[images, heads, patches, head_dim]` (the same computation: attention never
  crosses images) and tiles one image's rotary positions over all of them, through transformers'
  own precomputed-`position_ids` hook. Images of different sizes, flash attention or eager
  attention take the stock path unchanged. It works by swapping the classes of the vision
  modules for subclasses (not by patching methods), so deep copies, PEFT and FSDP2 see ordinary
  modules.

Tested against the stock code: positions equal, vision outputs and gradients equal to fp32
rounding (tests/models/test_qwen_vl_batched.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

try:  # Qwen3-VL's modules (transformers >= 4.57); without them nothing is swapped
    from transformers.models.qwen3_vl import modeling_qwen3_vl as _qwen3_vl
except ImportError:  # pragma: no cover - every supported transformers has Qwen3-VL
    _qwen3_vl = None


def spatial_merge_size(model: Any) -> int | None:
    """The vision merge size of a Qwen3-VL model (PEFT-wrapped or not), or None for other models."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "qwen3_vl":
        return None
    return int(config.vision_config.spatial_merge_size)


def mrope_position_ids(batch: dict[str, torch.Tensor], merge_size: int | None) -> torch.Tensor | None:
    """M-RoPE position ids [3, B, L] of a collated batch, equal to Qwen3-VL's `get_rope_index`.

    Text tokens count up by one on all three axes; an image of h x w merged tokens starting at
    position p gives its token (r, c) the positions (p, p + r, p + c), and the text after it
    starts at p + max(h, w). Padding positions are 0. Returns None when the batch has no images,
    holds videos, or the model is not Qwen3-VL (merge_size None): the model then computes them.
    """
    grid = batch.get("image_grid_thw")
    if merge_size is None or grid is None or len(grid) == 0:
        return None
    mm = batch["mm_token_type_ids"].cpu()
    if bool((mm > 1).any()) or bool((grid[:, 0] != 1).any()):
        return None  # videos (or multi-frame images): the stock computation
    valid = batch["attention_mask"].cpu().bool()
    grid = grid.cpu().long()
    rows, cols = grid[:, 1] // merge_size, grid[:, 2] // merge_size
    tokens = rows * cols  # placeholder tokens per image
    is_image = (mm == 1) & valid
    # Image tokens in batch order belong to images in batch order (how the model matches them).
    rank = torch.cumsum(is_image.reshape(-1).long(), 0).reshape(is_image.shape) - 1
    rank = torch.where(is_image, rank, torch.zeros_like(rank))
    ends = torch.cumsum(tokens, 0)
    image = torch.searchsorted(ends, rank, right=True).clamp(max=len(tokens) - 1)
    within = rank - (ends - tokens)[image]  # index of the token inside its image
    width = cols[image]
    last = within == tokens[image] - 1
    # Each token moves the next position on by 1 (text) or, on an image's last token, max(h, w).
    advance = torch.where(is_image, torch.where(last, torch.maximum(rows, cols)[image], 0), valid.long())
    start = torch.cumsum(advance, dim=1) - advance
    r = torch.where(is_image, within // width, 0)
    c = torch.where(is_image, within % width, 0)
    positions = torch.stack([start, start + r, start + c])
    return torch.where(valid, positions, 0)


if _qwen3_vl is not None:

    class BatchedQwen3VLVisionAttention(_qwen3_vl.Qwen3VLVisionAttention):
        """Vision attention with one sdpa call for a batch of same-size images."""

        def forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kwargs):
            if self.config._attn_implementation != "sdpa" or position_embeddings is None:
                return super().forward(hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
            lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()  # the stock path syncs here too
            if len(lengths) < 2 or any(n != lengths[0] for n in lengths):
                return super().forward(hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
            seq, images, length = hidden_states.shape[0], len(lengths), lengths[0]
            q, k, v = self.qkv(hidden_states).reshape(seq, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
            cos, sin = position_embeddings
            q, k = _qwen3_vl.apply_rotary_pos_emb_vision(q, k, cos, sin)
            q, k, v = (t.reshape(images, length, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.attention_dropout if self.training else 0.0, scale=self.scaling
            )
            return self.proj(out.transpose(1, 2).reshape(seq, -1))

    class BatchedQwen3VLVisionModel(_qwen3_vl.Qwen3VLVisionModel):
        """The vision tower, with one image's rotary positions tiled when all images are the same size."""

        def forward(self, hidden_states, grid_thw, **kwargs):
            if "position_ids" not in kwargs and len(grid_thw) > 1:
                sizes = grid_thw.tolist()
                if all(s == sizes[0] for s in sizes):
                    one = _qwen3_vl.get_vision_position_ids(grid_thw[:1], self.spatial_merge_size)
                    kwargs["position_ids"] = one.repeat(len(sizes), 1)
            return super().forward(hidden_states, grid_thw, **kwargs)

    _SWAPS = {
        _qwen3_vl.Qwen3VLVisionAttention: BatchedQwen3VLVisionAttention,
        _qwen3_vl.Qwen3VLVisionModel: BatchedQwen3VLVisionModel,
    }
else:  # pragma: no cover
    _SWAPS = {}


def use_batched_vision(model: torch.nn.Module, enabled: bool = True) -> int:
    """Swap the Qwen3-VL vision modules of `model` for their batched subclasses (`enabled=False`:
    back to transformers' own classes); returns how many were swapped (0 for other architectures,
    or when nothing was left to swap)."""
    swaps = _SWAPS if enabled else {batched: stock for stock, batched in _SWAPS.items()}
    swapped = 0
    for module in model.modules():
        target = swaps.get(type(module))
        if target is not None:
            module.__class__ = target
            swapped += 1
    return swapped


FORWARD_KEYS = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids", "position_ids")


def with_position_ids(batch: dict[str, torch.Tensor], merge_size: int | None) -> dict[str, torch.Tensor]:
    """The collated batch with its M-RoPE `position_ids` added (when `mrope_position_ids` gives them)."""
    if "position_ids" not in batch:
        positions = mrope_position_ids(batch, merge_size)
        if positions is not None:
            batch["position_ids"] = positions
    return batch


def forward_inputs(
    batch: dict[str, torch.Tensor], device: torch.device | str, merge_size: int | None
) -> dict[str, torch.Tensor]:
    """The model's forward inputs from a collated CPU batch, on `device`, with M-RoPE positions
    computed here on the CPU instead of by the model's per-image loop."""
    batch = with_position_ids(batch, merge_size)
    return {k: batch[k].to(device, non_blocking=True) for k in FORWARD_KEYS if k in batch}
