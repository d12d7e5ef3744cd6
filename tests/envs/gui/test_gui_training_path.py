"""The gui env through the unchanged training machinery: rollouts of the tiny model and SFT transcripts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from vlrl.config import load_config
from vlrl.envs.base import build_split, replay_trace
from vlrl.rollout.episodes import RolloutStats
from vlrl.training.sft import oracle_transcript
from vlrl.training.worker import Worker

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def gui_worker(ci_model_dir, tmp_path):
    cfg = load_config(
        ROOT / "configs" / "gui-cpu.yaml",
        [
            f"model.path={ci_model_dir}",
            f"storage.root={tmp_path / 'runs'}",
            "runtime.backend=local",
            "model.lora.include_vision=false",
        ],
    )
    return Worker(cfg, total_optimizer_steps=2)


def test_rollouts_on_gui_tasks_replay_from_their_traces(gui_worker):
    split = build_split(gui_worker.config.env, "train")
    stats = RolloutStats()
    eps = gui_worker.rollout([split[0], split[1]], 2, gui_worker.sampling_params(seed=0), stats)
    assert len(eps) == 4
    for e in eps:
        assert e.trace["env"] == "gui" and 1 <= len(e.trace["turns"]) <= gui_worker.config.env.max_turns
        assert e.trace["done"] and len(e.sequence.images) == len(e.trace["turns"])  # one screenshot a turn
        replay = replay_trace(e.trace)
        assert replay["matches"], replay
        assert abs(replay["return"] - e.reward) < 1e-9


def test_sft_transcripts_clone_the_gui_oracle(gui_worker):
    config = gui_worker.config
    task = build_split(config.env, "train")[3]
    seq = oracle_transcript(config, gui_worker.chat, task, random.Random(0))
    tok = gui_worker.processor.tokenizer
    texts = [tok.decode(seq.token_ids[a:b], skip_special_tokens=True) for a, b in seq.response_spans]
    assert sum(seq.loss_mask) == sum(b - a for a, b in seq.response_spans)  # the oracle's turns carry the loss
    assert (
        len(texts) == 1 and texts[0].startswith("<action>click(") and texts[0].endswith(")</action>")
    )  # level 1: one click
    assert len(seq.images) == 1
