"""Token sequences with images: what the engine samples from and the policy trains on.

A multi-turn episode is ONE growing token sequence: the prompt, then alternately the model's
response (loss mask 1) and the environment's next observation (loss mask 0). Token ids are the
source of truth: the response is never re-tokenized from text, so what the policy is trained on
is exactly what the engine sampled.

`ChatFormat` turns messages into token pieces with the model's own chat template. It renders the
template twice (with and without the next message) and keeps the difference, so the pieces are
right for any template that only appends as a conversation grows (Qwen's does), and it checks that
property instead of assuming it.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from vlrl.envs.base import Observation
from vlrl.errors import VlrlError

log = logging.getLogger(__name__)

_PLACEHOLDER = "\x00VLRL_RESPONSE\x00"


@dataclass
class MultimodalSequence:
    """One conversation as tokens, with the processed images in order of appearance."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 = sampled by the policy
    logprobs: list[float] = field(default_factory=list)  # sampling log-prob where loss_mask is 1, else 0
    mm_token_type_ids: list[int] = field(default_factory=list)  # 1 on image placeholder tokens
    images: list[Image.Image] = field(default_factory=list)
    pixel_values: list[torch.Tensor] = field(default_factory=list)  # per image: [patches, dim]
    image_grid_thw: list[torch.Tensor] = field(default_factory=list)  # per image: [3]
    # [start, end) of each response the policy sampled, one per turn: per-turn advantages
    # (GiGPO) reach their turn's tokens through these.
    response_spans: list[tuple[int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend(self, piece: MultimodalSequence) -> None:
        offset = len(self.token_ids)
        self.response_spans += [(start + offset, end + offset) for start, end in piece.response_spans]
        self.token_ids += piece.token_ids
        self.loss_mask += piece.loss_mask
        self.logprobs += piece.logprobs
        self.mm_token_type_ids += piece.mm_token_type_ids
        self.images += piece.images
        self.pixel_values += piece.pixel_values
        self.image_grid_thw += piece.image_grid_thw

    def append_sampled(self, token_ids: list[int], logprobs: list[float]) -> None:
        """Append one response the policy generated (its tokens carry loss and their sampling log-probs)."""
        self.response_spans.append((len(self.token_ids), len(self.token_ids) + len(token_ids)))
        self.token_ids += token_ids
        self.loss_mask += [1] * len(token_ids)
        self.logprobs += list(logprobs)
        self.mm_token_type_ids += [0] * len(token_ids)

    def copy(self) -> MultimodalSequence:
        return MultimodalSequence(
            list(self.token_ids),
            list(self.loss_mask),
            list(self.logprobs),
            list(self.mm_token_type_ids),
            list(self.images),
            list(self.pixel_values),
            list(self.image_grid_thw),
            list(self.response_spans),
        )


class ChatFormat:
    """Builds token pieces of a conversation with a processor's chat template and image processor."""

    def __init__(self, processor: Any, image_cache_mb: int = 512):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.eos_id: int = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if self.eos_id is None or self.eos_id == self.tokenizer.unk_token_id:
            self.eos_id = self.tokenizer.eos_token_id
        # What batches are padded with: the tokenizer's pad token, else end-of-turn (masked out either way).
        pad = self.tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else self.eos_id
        # The direct path (`_encode`): None until its first result has been checked against the processor's.
        self._direct: bool | None = None
        self._text_ids: dict[str, list[int]] = {}
        self._suffixes: dict[tuple[str, int], str] = {}
        self._images = _ImageCache(
            image_processor=getattr(processor, "image_processor", None), max_bytes=image_cache_mb << 20
        )
        self._image_token = getattr(processor, "image_token", None)
        self._image_token_id = self.tokenizer.convert_tokens_to_ids(self._image_token) if self._image_token else None
        merge = getattr(getattr(processor, "image_processor", None), "merge_size", None)
        self._merge = int(merge) if merge else None

    # -- text of the template -----------------------------------------------------------
    @staticmethod
    def _message(role: str, obs: Observation | None = None, text: str | None = None) -> dict[str, Any]:
        if obs is None:
            return {"role": role, "content": [{"type": "text", "text": text or ""}]}
        content = [{"type": "image"} for _ in obs.images] + [{"type": "text", "text": obs.text}]
        return {"role": role, "content": content}

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _encode(self, text: str, images: list[Image.Image]) -> MultimodalSequence:
        """Token ids, image placeholders expanded, and the processed images of one piece of text.

        The processor's call costs ~2 ms a piece (kwargs merging, tokenizing twice, tensor
        conversion), more than the environment's step; a multi-turn rollout encodes one piece per
        episode per turn. So, once a first piece encoded both ways came out identical, pieces are
        built directly: the text's ids (memoised: the env's texts repeat), each image placeholder
        repeated as the processor repeats it (patches / merge^2), and the image processor's output
        for each image (memoised by pixel content: episodes of a group often see the same screen).
        If the two ways ever differ, the processor is used from then on.
        """
        if images and self._direct is not False:
            direct = self._encode_direct(text, images)
            if direct is not None and self._direct:
                return direct
            reference = self._encode_with_processor(text, images)
            self._direct = direct is not None and _same_piece(direct, reference)
            if direct is not None and not self._direct:
                log.warning(
                    "encoding pieces without the processor gave other tokens or pixels; using the processor from now on"
                )
            return reference
        return self._encode_with_processor(text, images)

    def _encode_direct(self, text: str, images: list[Image.Image]) -> MultimodalSequence | None:
        if self._image_token_id is None or not self._merge or self._images.image_processor is None:
            return None
        ids = self._text_ids.get(text)
        if ids is None:
            if len(self._text_ids) >= 4096:
                self._text_ids.clear()
            ids = self._text_ids[text] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        processed = [self._images.get(image) for image in images]
        out: list[int] = []
        image = 0
        for t in ids:
            if t != self._image_token_id:
                out.append(t)
                continue
            if image >= len(processed):
                return None
            out += [t] * (int(processed[image][1].prod()) // self._merge**2)
            image += 1
        if image != len(processed):
            return None
        return MultimodalSequence(
            token_ids=out,
            loss_mask=[0] * len(out),
            logprobs=[0.0] * len(out),
            mm_token_type_ids=[int(t == self._image_token_id) for t in out],
            images=list(images),
            pixel_values=[p for p, _ in processed],
            image_grid_thw=[g for _, g in processed],
        )

    def _encode_with_processor(self, text: str, images: list[Image.Image]) -> MultimodalSequence:
        if images:
            out = self.processor(text=[text], images=images, return_tensors="pt")
            grids = list(out["image_grid_thw"])
            # pixel_values is one [sum(patches), dim] tensor; split it back per image.
            sizes = [int(g.prod()) for g in grids]
            pixels = list(torch.split(out["pixel_values"], sizes, dim=0))
            mm = out.get("mm_token_type_ids")
            ids = out["input_ids"][0].tolist()
            mm_ids = mm[0].tolist() if mm is not None else [0] * len(ids)
        else:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            grids, pixels, mm_ids = [], [], [0] * len(ids)
        return MultimodalSequence(
            token_ids=ids,
            loss_mask=[0] * len(ids),
            logprobs=[0.0] * len(ids),
            mm_token_type_ids=mm_ids,
            images=list(images),
            pixel_values=pixels,
            image_grid_thw=grids,
        )

    # -- pieces -------------------------------------------------------------------------
    def response_ids(self, text: str) -> list[int]:
        """The tokens of `text` as the model's whole answer: the text, then the end-of-turn token."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos_id]

    def prompt(self, system_prompt: str, obs: Observation) -> MultimodalSequence:
        """System message + first user observation + the assistant header, ready to sample."""
        messages = []
        if system_prompt:
            messages.append(self._message("system", text=system_prompt))
        messages.append(self._message("user", obs))
        return self._encode(self._render(messages, True), obs.images)

    def observation_piece(self, obs: Observation, response_ended: bool) -> MultimodalSequence:
        """Tokens that close the model's turn, add the next user observation and open a new turn.

        `response_ended` says whether the sampled response already ended with the end-of-turn
        token; when it was cut by the token budget the end-of-turn token is added here, as an
        environment token (loss mask 0).
        """
        piece = self._encode(self._observation_suffix(obs.text, len(obs.images)), obs.images)
        if response_ended and piece.token_ids and piece.token_ids[0] == self.eos_id:
            for name in ("token_ids", "loss_mask", "logprobs", "mm_token_type_ids"):
                del getattr(piece, name)[0]
        return piece

    def _observation_suffix(self, text: str, images: int) -> str:
        """The template text after the model's response, up to the next assistant header
        (memoised: it depends only on the observation's text and image count)."""
        key = (text, images)
        suffix = self._suffixes.get(key)
        if suffix is None:
            obs = Observation([None] * images, text)
            before = [self._message("user", text="x")]
            after = before + [self._message("assistant", text=_PLACEHOLDER), self._message("user", obs)]
            head = self._render(before, True)
            full = self._render(after, True)
            if not full.startswith(head + _PLACEHOLDER):
                raise VlrlError(
                    "the model's chat template rewrites earlier turns; multi-turn token sequences need an "
                    "append-only template"
                )
            if len(self._suffixes) >= 4096:
                self._suffixes.clear()
            suffix = self._suffixes[key] = full[len(head) + len(_PLACEHOLDER) :]
        return suffix


class _ImageCache:
    """The image processor's output per image, memoised by pixel content (bounded in bytes, LRU)."""

    def __init__(self, image_processor: Any, max_bytes: int):
        self.image_processor = image_processor
        self.max_bytes = max_bytes
        self.bytes = 0
        self.entries: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._lut: np.ndarray | None = None  # [C, 256]: the processor's value of each uint8 per channel

    def get(self, image: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
        key = hashlib.blake2b(f"{image.mode}{image.size}".encode() + image.tobytes(), digest_size=16).digest()
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
            return hit
        entry = self._direct(image)
        if entry is None:
            out = self.image_processor(images=[image], return_tensors="pt")
            entry = (out["pixel_values"], out["image_grid_thw"][0])
        size = entry[0].numel() * entry[0].element_size()
        if size <= self.max_bytes:
            self.entries[key] = entry
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (pixels, _) = self.entries.popitem(last=False)
                self.bytes -= pixels.numel() * pixels.element_size()
        return entry

    def _direct(self, image: Image.Image) -> tuple[torch.Tensor, torch.Tensor] | None:
        """What Qwen2-VL's image processor computes for an RGB image it would not resize, as a table
        lookup (its float64 rescale and float32 normalise of each uint8 value) and its patch layout;
        None for any other image or processor. ChatFormat checks a first result against the processor."""
        ip = self.image_processor
        if image.mode != "RGB" or not all(
            hasattr(ip, a) for a in ("patch_size", "merge_size", "temporal_patch_size", "size")
        ):
            return None
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        p, m, tp = int(ip.patch_size), int(ip.merge_size), int(ip.temporal_patch_size)
        w, h = image.size
        size = ip.size
        if smart_resize(h, w, factor=p * m, min_pixels=size["shortest_edge"], max_pixels=size["longest_edge"]) != (
            h,
            w,
        ):
            return None
        if self._lut is None:
            # Every uint8 value per channel through the processor's arithmetic, once: elementwise
            # float operations give the same result on a table of values as on an image.
            x = np.arange(256, dtype=np.uint8)[None, :].repeat(3, axis=0)  # [C, 256] as a 1-pixel-high CHW
            if ip.do_rescale:
                x = (x.astype(np.float64) * ip.rescale_factor).astype(np.float32)
            x = x.astype(np.float32)
            if ip.do_normalize:
                mean, std = (np.array(v, dtype=np.float32) for v in (ip.image_mean, ip.image_std))
                x = ((x.T - mean) / std).T
            self._lut = np.ascontiguousarray(x)
        pixels = np.asarray(image).transpose(2, 0, 1)  # CHW uint8
        x = np.stack([self._lut[c][pixels[c]] for c in range(3)])
        gh, gw = h // p, w // p
        x = x.reshape(3, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], tp, p, p)).reshape(gh * gw, 3 * tp * p * p)
        return torch.from_numpy(np.ascontiguousarray(x)), torch.tensor([1, gh, gw])


def _same_piece(a: MultimodalSequence, b: MultimodalSequence) -> bool:
    return (
        a.token_ids == b.token_ids
        and a.mm_token_type_ids == b.mm_token_type_ids
        and len(a.pixel_values) == len(b.pixel_values)
        and all(torch.equal(x, y) for x, y in zip(a.pixel_values, b.pixel_values))
        and all(torch.equal(x, y) for x, y in zip(a.image_grid_thw, b.image_grid_thw))
    )


def collate(
    sequences: list[MultimodalSequence], pad_id: int, side: str = "right", pixels: bool = True
) -> dict[str, torch.Tensor]:
    """Pad sequences into one batch of model inputs (plus loss mask and sampling log-probs).

    Images are concatenated in batch order, which is the order the model matches image
    placeholder tokens to image features. `pixels=False` leaves pixel_values out (the grids stay):
    for a caller that has most images' vision features already and copies only the new pixels.
    """
    longest = max(len(s) for s in sequences)
    batch = len(sequences)
    ids = torch.full((batch, longest), pad_id, dtype=torch.long)
    attn = torch.zeros((batch, longest), dtype=torch.long)
    mask = torch.zeros((batch, longest), dtype=torch.float32)
    logp = torch.zeros((batch, longest), dtype=torch.float32)
    mm = torch.zeros((batch, longest), dtype=torch.long)
    for i, s in enumerate(sequences):
        n = len(s)
        sl = slice(0, n) if side == "right" else slice(longest - n, longest)
        ids[i, sl] = torch.tensor(s.token_ids, dtype=torch.long)
        attn[i, sl] = 1
        mask[i, sl] = torch.tensor(s.loss_mask, dtype=torch.float32)
        logp[i, sl] = torch.tensor(s.logprobs, dtype=torch.float32)
        mm[i, sl] = torch.tensor(s.mm_token_type_ids, dtype=torch.long)
    out = {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": mask,
        "sample_logprobs": logp,
        "mm_token_type_ids": mm,
    }
    grids = [g for s in sequences for g in s.image_grid_thw]
    if grids:
        if pixels:
            out["pixel_values"] = torch.cat([p for s in sequences for p in s.pixel_values], dim=0)
        out["image_grid_thw"] = torch.stack(grids)
    return out
