"""SFT's learning-rate schedule and its transcript batches played by worker processes."""

from __future__ import annotations

import math
import random

import pytest
import torch

from vlrl.config import load_config
from vlrl.envs.base import build_split
from vlrl.models.processor import load_processor
from vlrl.rollout.sequence import ChatFormat
from vlrl.training.sft import TranscriptBatches, lr_factor


def test_lr_factor_warms_up_then_follows_the_schedule():
    assert [lr_factor(i, "constant", 4, 100) for i in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr_factor(4, "linear", 4, 104) == 1.0 and lr_factor(54, "linear", 4, 104) == 0.5
    assert lr_factor(104, "linear", 4, 104) == 0.0
    assert math.isclose(lr_factor(54, "cosine", 4, 104), 0.5) and math.isclose(
        lr_factor(104, "cosine", 4, 104), 0.0, abs_tol=1e-12
    )
    assert lr_factor(10, "linear", 0, 10) == 0.0  # no warm-up: the old `1 - i / total`
    # A time budget further along than the steps drives the decay; constant stays constant.
    assert lr_factor(14, "linear", 4, 104, time_fraction=0.5) == 0.5
    assert lr_factor(94, "linear", 4, 104, time_fraction=0.5) == pytest.approx(0.1)  # steps further along
    assert math.isclose(lr_factor(14, "cosine", 4, 104, time_fraction=1.0), 0.0, abs_tol=1e-12)
    assert lr_factor(14, "constant", 4, 104, time_fraction=0.9) == 1.0


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_worker_batches_do_not_depend_on_the_worker_count(ci_model_dir, noise):
    config = load_config(
        "configs/ci-tiny.yaml", [f"model.path={ci_model_dir}", "train.sft.batch_size=3", f"train.sft.noise={noise}"]
    )
    chat = ChatFormat(load_processor(ci_model_dir))
    split = build_split(config.env, "train")
    tasks = [split[i] for i in range(7)]
    pad = chat.tokenizer.pad_token_id
    runs = []
    for workers in (1, 2):
        batches = TranscriptBatches(config, chat, tasks, pad)
        runs.append([b for epoch in range(2) for b in batches.epoch(epoch, random.Random(0), workers=workers)])
    one, two = runs
    assert [b["input_ids"].shape[0] for b in one] == [3, 3, 1, 3, 3, 1]
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_stopiteration_while_playing_a_batch_fails_the_epoch_instead_of_ending_it(ci_model_dir, monkeypatch):
    """A DataLoader worker takes StopIteration from its collate_fn for the end of the data: a demonstrator
    bug once ended every SFT epoch after one batch without a word. It must fail the run instead."""
    import vlrl.training.sft as sft

    config = load_config("configs/ci-tiny.yaml", [f"model.path={ci_model_dir}", "train.sft.batch_size=2"])
    chat = ChatFormat(load_processor(ci_model_dir))
    split = build_split(config.env, "train")
    tasks = [split[i] for i in range(6)]
    broken = tasks[3].seed
    play = sft.oracle_transcript

    def demonstrator_with_a_bug(cfg, chat_format, task, rng):
        if task.seed == broken:
            next(iter(()))  # a StopIteration from deep inside a demonstrator
        return play(cfg, chat_format, task, rng)

    monkeypatch.setattr(sft, "oracle_transcript", demonstrator_with_a_bug)  # forked workers inherit it
    batches = TranscriptBatches(config, chat, tasks, chat.tokenizer.pad_token_id)
    with pytest.raises(RuntimeError, match="StopIteration"):
        list(batches.epoch(0, random.Random(0), workers=1))
