"""Helpers for the model tests: small maze-like pictures and chat inputs."""

from __future__ import annotations

import torch
from PIL import Image, ImageDraw


def maze_like_image(size: int = 80, seed: int = 0) -> Image.Image:
    """A small maze-like picture: white floor, gray walls, blue circle, red square."""
    g = torch.Generator().manual_seed(seed)
    img = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(img)
    cell = size // 8
    for _ in range(10):
        x, y = (torch.randint(0, 8, (2,), generator=g) * cell).tolist()
        draw.rectangle([x, y, x + cell - 1, y + cell - 1], fill=(128, 128, 128))
    draw.ellipse([2, 2, cell - 2, cell - 2], fill=(0, 0, 255))
    draw.rectangle([size - cell + 2, size - cell + 2, size - 3, size - 3], fill=(255, 0, 0))
    return img


def chat_inputs(processor, texts: list[str], images: list[Image.Image]):
    """Processor inputs for one user turn per (text, image), left-padded for generation."""
    prompts = [
        processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for t in texts
    ]
    return processor(text=prompts, images=images, return_tensors="pt", padding=True, padding_side="left")
