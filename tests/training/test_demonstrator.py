"""SFT on an imperfect demonstrator (train.sft.demonstrator): the walker's transcripts, its measured
success in the lineage, and the bad inputs (an unknown name, an env without a walker)."""

from __future__ import annotations

import json
import logging

from typer.testing import CliRunner

from vlrl.envs.base import build_split
from vlrl.training.sft import check_demonstrator, demonstrator_result, oracle_transcript, sft_tasks


def test_sft_on_the_walker_records_it_in_the_lineage_and_warns_of_its_failures(ci_config, tmp_path, caplog):
    from vlrl.training.sft import run_sft

    cfg = ci_config(
        "train.sft.demonstrator=walker", "env.max_turns=4", "train.sft.episodes=16", "train.sft.batch_size=8"
    )
    with caplog.at_level(logging.WARNING, logger="vlrl.training.sft"):
        out = run_sft(cfg, tmp_path / "sft")
    # at 4 turns on 3x3 mazes (start and goal in opposite corners) the walker fails some tasks:
    # said once, with the share, and SFT went on
    warned = [r.getMessage() for r in caplog.records if "fails" in r.getMessage()]
    assert len(warned) == 1 and "of 16 SFT tasks (maze size 3x3) within env.max_turns=4" in warned[0]
    recorded = json.loads((out / "sft_demonstrator.json").read_text())
    assert recorded["name"] == "walker" and recorded["tasks"] == 16 and 0 < recorded["success_rate"] < 1
    lineage = json.loads((tmp_path / "sft" / "lineage.json").read_text())
    assert lineage["demonstrator"] == recorded and lineage["config"]["train"]["sft"]["demonstrator"] == "walker"


def test_walker_transcripts_differ_from_the_oracle_and_the_result_pairs_with_the_models(ci_config):
    import random

    from vlrl.models.processor import load_processor
    from vlrl.rollout.sequence import ChatFormat

    oracle, walker = ci_config("env.max_turns=8"), ci_config("env.max_turns=8", "train.sft.demonstrator=walker")
    chat = ChatFormat(load_processor(oracle.model.path))
    tasks = sft_tasks(oracle)[:32]
    differ = sum(
        oracle_transcript(oracle, chat, t, random.Random(0)).token_ids
        != oracle_transcript(walker, chat, t, random.Random(0)).token_ids
        for t in tasks
    )
    assert differ > 0  # the walker explores dead ends the oracle never enters
    # the walker's own result: one episode per task, keyed as the models' evaluation keys them
    holdout = build_split(walker.env, "holdout")
    result = demonstrator_result(walker, [holdout[i] for i in range(8)], label="demonstrator")
    assert result.summary()["n"] == 8 and len(result.outcomes()) == 8
    assert check_demonstrator(oracle, tasks)["success_rate"] == 1.0  # 8 turns: the oracle solves every 3x3 maze


def test_an_unknown_demonstrator_or_an_env_without_a_walker_is_one_clear_line(ci_model_dir, tmp_path):
    from vlrl.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["sft", "configs/ci-tiny.yaml", "train.sft.demonstrator=walkr", "-o", str(tmp_path / "a")])
    assert r.exit_code != 0
    text = r.output + str(r.exception or "")
    assert "train.sft.demonstrator = 'walkr'" in text and "did you mean 'walker'?" in text
    r = runner.invoke(
        app,
        [
            "sft",
            "configs/gui-cpu.yaml",
            "train.sft.demonstrator=walker",
            f"storage.root={tmp_path / 'runs'}",
            "-o",
            str(tmp_path / "b"),
        ],
    )
    assert r.exit_code != 0
    line = str(r.exception)
    assert line == (
        "train.sft.demonstrator = 'walker': env 'gui' has no demonstrator but its oracle; "
        "set train.sft.demonstrator=oracle"
    )
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())  # nothing trained
