"""ChatFormat builds pieces without the processor's call only where that gives the processor's result."""

from __future__ import annotations

import logging

import pytest
import torch

from vlrl.config import load_config
from vlrl.envs.base import build_split, make_env
from vlrl.models import build_tiny_model, load_processor
from vlrl.rollout.sequence import ChatFormat


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    return load_processor(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", size="ci", seed=0))


def _observations(config_path: str, overrides: list[str], episodes: int):
    """First and later observations of oracle-played episodes of a shipped config's env."""
    config = load_config(config_path, overrides)
    split = build_split(config.env, "train")
    env = make_env(config.env)
    out = []
    for i in range(episodes):
        obs = env.reset(split[i])
        out.append((env.system_prompt, obs, True))
        for _ in range(4):
            result = env.step(env.oracle_response())
            if result.done:
                break
            out.append((env.system_prompt, result.observation, False))
    return out


@pytest.mark.parametrize(
    "config_path,overrides",
    [
        ("configs/demo-cpu.yaml", []),
        ("configs/gpu-maze9.yaml", ["model.init_tiny=ci"]),
        ("configs/gui-cpu.yaml", []),
        ("configs/gui-cpu.yaml", ["env.levels=[2]", "env.width=128", "env.height=96"]),  # not square
    ],
)
def test_direct_pieces_equal_the_processors(processor, config_path, overrides):
    direct, reference = ChatFormat(processor), ChatFormat(processor)
    reference._direct = False  # always the processor's call
    for system, obs, first in _observations(config_path, overrides, episodes=6):
        a = direct.prompt(system, obs) if first else direct.observation_piece(obs, response_ended=True)
        b = reference.prompt(system, obs) if first else reference.observation_piece(obs, response_ended=True)
        assert a.token_ids == b.token_ids and a.mm_token_type_ids == b.mm_token_type_ids
        assert a.loss_mask == b.loss_mask and a.logprobs == b.logprobs
        assert len(a.pixel_values) == len(b.pixel_values) == len(obs.images)
        for x, y in zip(a.pixel_values, b.pixel_values):
            assert torch.equal(x, y)
        for x, y in zip(a.image_grid_thw, b.image_grid_thw):
            assert torch.equal(x, y)
    assert direct._direct is True  # the check passed, later pieces skipped the processor


def test_repeated_screens_reuse_the_processed_image(processor):
    chat = ChatFormat(processor)
    (system, obs, _), *_ = _observations("configs/demo-cpu.yaml", [], episodes=1)
    first, second = chat.prompt(system, obs), chat.prompt(system, obs)  # the first is checked against the processor
    third = chat.prompt(system, obs)
    assert second.pixel_values[0] is third.pixel_values[0]
    assert torch.equal(first.pixel_values[0], third.pixel_values[0])


def test_a_direct_piece_that_differs_falls_back_to_the_processor_for_good(processor, caplog):
    chat = ChatFormat(processor)
    chat._merge = 1  # as if the processor expanded placeholders another way: the direct ids come out wrong
    (system, obs, _), *_ = _observations("configs/demo-cpu.yaml", [], episodes=1)
    reference = ChatFormat(processor)
    reference._direct = False
    with caplog.at_level(logging.WARNING, logger="vlrl.rollout.sequence"):
        piece = chat.prompt(system, obs)
    assert chat._direct is False
    assert "using the processor from now on" in caplog.text
    assert piece.token_ids == reference.prompt(system, obs).token_ids
    assert chat.prompt(system, obs).token_ids == piece.token_ids


@pytest.mark.parametrize("size", [(48, 48), (144, 144), (128, 96), (16, 224)])
def test_direct_pixels_equal_the_image_processors_on_every_value(processor, size):
    import numpy as np
    from PIL import Image

    from vlrl.rollout.sequence import _ImageCache

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")
    pixels, grid = _ImageCache(processor.image_processor, 1 << 20)._direct(image)
    reference = processor.image_processor(images=[image], return_tensors="pt")
    assert torch.equal(pixels, reference["pixel_values"]) and torch.equal(grid, reference["image_grid_thw"][0])


def test_direct_pixels_leave_other_images_to_the_processor(processor):
    from PIL import Image

    from vlrl.rollout.sequence import _ImageCache

    cache = _ImageCache(processor.image_processor, 1 << 20)
    assert cache._direct(Image.new("RGBA", (48, 48))) is None  # the processor converts it first
    assert cache._direct(Image.new("RGB", (50, 50))) is None  # the processor resizes it
    pixels, _ = cache.get(Image.new("RGB", (50, 50), (9, 99, 199)))
    reference = processor.image_processor(images=[Image.new("RGB", (50, 50), (9, 99, 199))], return_tensors="pt")
    assert torch.equal(pixels, reference["pixel_values"])
