"""Checkpoints (in-process worker): exact resume, damaged checkpoints, config changes on resume,
retention, fsspec storage, and `vlrl train --resume auto` after the driver was killed."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from run_compare import same, step_numbers
from typer.testing import CliRunner

from vlrl.config import load_config
from vlrl.errors import VlrlError
from vlrl.runtime import distributed
from vlrl.training.checkpoint import (
    CheckpointStore,
    check_resume_config,
    config_changes,
    find_checkpoint,
    read_checkpoint,
    verify,
)
from vlrl.training.trainer import GRPOTrainer

ROOT = Path(__file__).resolve().parents[2]
# Short episodes and a tiny evaluation keep each step cheap; an evaluation every 2 steps puts
# eval metrics into the history on both sides of the resume.
FAST = [
    "env.max_turns=2",
    "rollout.max_new_tokens=4",
    "train.eval_tasks=2",
    "train.eval_every=2",
    "runtime.torch_threads=1",
]


def _config(model_dir, root, *overrides):
    base = [f"model.path={model_dir}", f"storage.root={root}", "runtime.backend=local", *FAST]
    return load_config(ROOT / "configs" / "ci-tiny.yaml", base + list(overrides))


def _optimizer(trainer):
    return distributed.optimizer_state(trainer.worker.model, trainer.worker.policy.optimizer)


def _equal_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def straight(ci_model_dir, tmp_path_factory):
    """6 steps in one go, checkpoints at steps 3 and 6 (the reference, and checkpoints to damage)."""
    root = tmp_path_factory.mktemp("straight")
    cfg = _config(ci_model_dir, root, "train.steps=6", "train.checkpoint_every=3")
    trainer = GRPOTrainer(cfg, root / "run")
    trainer.setup()
    trainer.train()
    yield trainer
    trainer.close()


def test_resume_is_exact_6_steps_vs_3_then_resume_then_3(straight, ci_model_dir, tmp_path):
    """The process that ran steps 1-3 dies after its checkpoint; a new one resumes with
    --resume auto semantics. Adapter, optimizer (every AdamW moment and step count), scheduler,
    per-step metrics and evaluations come out bit-identical to the uninterrupted run."""
    cfg = _config(ci_model_dir, tmp_path, "train.steps=6", "train.checkpoint_every=3")
    first = GRPOTrainer(cfg, tmp_path / "run")
    first.setup()
    for _ in range(3):
        first.step()
    first.save_checkpoint()
    first.step()  # step 4 is lost with the process: metrics.jsonl has it, no checkpoint does
    first.close()

    resumed = GRPOTrainer(cfg, tmp_path / "run")
    resumed.setup()
    assert resumed.load_checkpoint("auto").name == "step-000003" and resumed.step_idx == 3
    resumed.train()

    assert _equal_tensors(straight.worker.adapter_state(), resumed.worker.adapter_state())
    a, b = _optimizer(straight), _optimizer(resumed)
    assert a["state"].keys() == b["state"].keys() and a["param_groups"] == b["param_groups"]
    assert all(_equal_tensors(a["state"][n], b["state"][n]) for n in a["state"])
    assert float(next(iter(b["state"].values()))["step"]) == 6  # one AdamW step per GRPO step here
    assert straight.worker.policy.scheduler.state_dict() == resumed.worker.policy.scheduler.state_dict()
    assert same(step_numbers(straight.history), step_numbers(resumed.history))
    assert same(straight.evals, resumed.evals) and [e["step"] for e in resumed.evals] == [2, 4, 6]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5, 6]  # the lost step 4 is not there twice
    events = [json.loads(line) for line in (tmp_path / "run" / "run-events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["step"], e["changed"]) for e in events] == [("resume", 3, {})]


def _damage(checkpoint: Path, how: str) -> None:
    if how == "truncate":
        f = checkpoint / "adapter.safetensors"
        f.write_bytes(f.read_bytes()[:-100])
    elif how == "flip_byte":
        shard = next((checkpoint / "optimizer").glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    elif how == "no_manifest":
        (checkpoint / "manifest.json").unlink()
    elif how == "leftover_temp":  # a write that died before its rename: step-6 stays valid
        temp = checkpoint.parent / ".tmp-step-000009-otherhost-4242-abcd1234"
        shutil.copytree(checkpoint, temp)
        (temp / "manifest.json").unlink()


@pytest.mark.parametrize("how", ["truncate", "flip_byte", "no_manifest", "leftover_temp"])
def test_damaged_checkpoint_is_reported_and_the_previous_one_used(straight, tmp_path, how, caplog):
    root = tmp_path / "checkpoints"
    shutil.copytree(straight.run_dir / "checkpoints", root)
    assert [p.name for p in sorted(root.iterdir())] == ["latest", "step-000003", "step-000006"]
    _damage(root / "step-000006", how)
    files_before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with caplog.at_level(logging.WARNING, logger="vlrl.training.checkpoint"):
        found = find_checkpoint("auto", str(root))
    warnings = [r.getMessage() for r in caplog.records if r.name == "vlrl.training.checkpoint"]
    if how == "leftover_temp":
        assert found == str(root / "step-000006") and not warnings  # temporary dirs are never read
    else:
        assert found == str(root / "step-000003")
        reason = {
            "truncate": "adapter.safetensors has",
            "flip_byte": "does not match its SHA-256",
            "no_manifest": "no manifest.json",
        }[how]
        assert len(warnings) == 1 and reason in warnings[0] and "\n" not in warnings[0]
        # an explicit path to the damaged one falls back the same way
        assert find_checkpoint(str(root / "step-000006"), str(root), quiet=True) == str(root / "step-000003")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == files_before  # looking deletes nothing
    assert verify(str(root / "step-000003")) is None


def test_resume_after_damage_continues_and_deletes_nothing_valid(straight, ci_model_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(straight.run_dir, run)
    _damage(run / "checkpoints" / "step-000006", "flip_byte")
    _damage(run / "checkpoints" / "step-000006", "leftover_temp")
    temp = run / "checkpoints" / ".tmp-step-000009-otherhost-4242-abcd1234"
    cfg = _config(ci_model_dir, tmp_path, "train.steps=6", "train.checkpoint_every=1", "train.keep_checkpoints=2")
    trainer = GRPOTrainer(cfg, run)
    trainer.setup()
    assert trainer.load_checkpoint("auto").name == "step-000003"
    assert [h["step"] for h in trainer.history] == [1, 2, 3]
    trainer.step()
    trainer.save_checkpoint()
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    # the damaged step 6 (a future the run no longer has) went at the resume; 3 and 4 are kept;
    # another writer's fresh temporary directory is left alone
    assert names == [".tmp-step-000009-otherhost-4242-abcd1234", "latest", "step-000003", "step-000004"]
    assert (run / "checkpoints" / "latest").read_text() == "step-000004"
    old = time.time() - 2 * 24 * 3600  # now it looks abandoned: the next write cleans it up
    for p in [temp, *temp.rglob("*")]:
        os.utime(p, (old, old))
    trainer.step()
    trainer.save_checkpoint()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000004", "step-000005"]
    trainer.close()


def test_config_changes_that_change_the_run_are_refused_by_name(straight, ci_model_dir, tmp_path):
    saved = read_checkpoint(str(straight.run_dir / "checkpoints" / "step-000006")).config
    changed = _config(
        ci_model_dir, tmp_path, "train.steps=9", "algo.group_size=8", "model.lora.rank=4", "env.sizes=[4]"
    ).model_dump(mode="json")
    with pytest.raises(VlrlError) as err:
        check_resume_config(saved, changed, "from step-000006")
    message = str(err.value)
    assert (
        "algo.group_size 4 -> 8" in message
        and "model.lora.rank 8 -> 4" in message
        and "env.sizes [3] -> [4]" in message
    )
    assert "train.steps" not in message.split("differ")[0] and "\n" not in message

    # the CLI refuses before starting anything, and the run is left as it was
    run = tmp_path / "runs" / "again"
    shutil.copytree(straight.run_dir, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    result = CliRunner().invoke(
        _app(),
        [
            "train",
            "configs/ci-tiny.yaml",
            f"model.path={ci_model_dir}",
            f"storage.root={tmp_path / 'runs'}",
            "storage.run_name=again",
            "runtime.backend=local",
            *FAST,
            "algo.group_size=8",
            "--resume",
            "auto",
        ],
    )
    assert isinstance(result.exception, VlrlError) and "algo.group_size 4 -> 8" in str(result.exception)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # and a new run may not start over an existing one by accident
    result = CliRunner().invoke(
        _app(),
        [
            "train",
            "configs/ci-tiny.yaml",
            f"model.path={ci_model_dir}",
            f"storage.root={tmp_path / 'runs'}",
            "storage.run_name=again",
            "runtime.backend=local",
        ],
    )
    assert isinstance(result.exception, VlrlError) and "--resume auto" in str(result.exception)


def test_the_env_config_class_says_which_env_keys_a_resume_may_change():
    from vlrl.config import load_config

    saved = load_config(None).model_dump(mode="json")
    current = load_config(None, ["env.adversarial_variants.themes=[dark]", "env.adversarial.count=10", "env.sizes=[7]"])
    refused, allowed = config_changes(saved, current.model_dump(mode="json"))
    assert set(allowed) == {"env.adversarial_variants.themes", "env.adversarial.count"} and set(refused) == {
        "env.sizes"
    }
    # another env: its name differs, so none of the env keys counts as safe
    other = load_config(None, ["env.name=maze_plan", "env.adversarial.count=10"]).model_dump(mode="json")
    refused, allowed = config_changes(saved, other)
    assert set(refused) == {"env.name", "env.adversarial.count"} and not allowed


def test_allowed_config_change_resumes_and_is_recorded(straight, ci_model_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(straight.run_dir, run)
    cfg = _config(ci_model_dir, tmp_path, "train.steps=7", "train.checkpoint_every=3", "train.eval_tasks=1")
    trainer = GRPOTrainer(cfg, run)
    trainer.setup()
    assert trainer.load_checkpoint(str(run)).name == "step-000006"  # a run directory names its newest checkpoint
    trainer.train()
    trainer.close()
    assert trainer.step_idx == 7
    changes = {
        "train.steps": [6, 7],
        "train.eval_tasks": [2, 1],
        "storage.root": [str(straight.run_dir.parent), str(tmp_path)],
    }  # the run was moved too
    events = [json.loads(line) for line in (run / "run-events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "resume" and events[-1]["changed"] == changes
    final = read_checkpoint(str(run / "checkpoints" / "step-000007"))
    assert final.trainer["config_changes"] == [{"step": 6, "changed": changes}]
    assert final.config["train"]["steps"] == 7 and "steps: 7" in (run / "config.yaml").read_text()


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 3)


def _tiny_optimizer_writer(seed: int):
    torch.manual_seed(seed)
    model = _Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    (model.layer(torch.ones(1, 4)) ** 2).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def _save(store: CheckpointStore, step: int) -> str:
    model, opt, sched = _tiny_optimizer_writer(step)
    return store.save(
        step,
        adapter={"w": torch.full((2, 2), float(step))},
        write_optimizer=lambda path: distributed.save_optimizer_checkpoint(model, opt, sched, path),
        rng_states=[{"rank": 0}],
        trainer={"note": step},
        config_yaml="train: {}\n",
    )


def test_retention_keeps_the_newest_k_and_never_the_newest_valid_one(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    store = CheckpointStore(root, keep=2)
    for step in range(1, 5):
        _save(store, step)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000003", "step-000004"]
    # Damaged checkpoints of later steps (an abandoned future) rank first by step; the one just
    # written is valid and stays although it is not among the newest two.
    for step in (8, 9):
        shutil.copytree(root / "step-000004", root / f"step-{step:06d}")
        (root / f"step-{step:06d}" / "trainer.json").write_text("{}")
    written = _save(store, 5)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000005", "step-000008", "step-000009"]
    with caplog.at_level(logging.WARNING, logger="vlrl.training.checkpoint"):
        assert store.newest_valid() == written
    assert len([r for r in caplog.records if r.name == "vlrl.training.checkpoint"]) == 2


@pytest.mark.parametrize("url", ["memory://vlrl-ckpt-test/run/checkpoints", "file://{tmp}/run/checkpoints"])
def test_checkpoints_on_fsspec_storage(url, tmp_path):
    """The same format through fsspec URLs (an object store behaves like memory://: no rename, no fsync)."""
    import fsspec

    url = url.format(tmp=tmp_path)
    store = CheckpointStore(url, keep=2)
    for step in (1, 2, 3):
        written = _save(store, step)
    fs = fsspec.core.url_to_fs(url)[0]
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(url, detail=False)) == ["latest", "step-000002", "step-000003"]
    assert fs.cat_file(f"{url}/latest") == b"step-000003" and verify(written) is None
    ckpt = read_checkpoint(find_checkpoint("auto", url))
    assert ckpt.step == 3 and torch.equal(ckpt.adapter["w"], torch.full((2, 2), 3.0)) and ckpt.trainer["note"] == 3
    # the optimizer state read back through DCP over fsspec is the one written
    model, opt, sched = _tiny_optimizer_writer(0)
    distributed.load_optimizer_checkpoint(model, opt, sched, ckpt.optimizer_path)
    _, ref_opt, ref_sched = _tiny_optimizer_writer(3)
    for p, q in zip(opt.param_groups[0]["params"], ref_opt.param_groups[0]["params"]):
        assert _equal_tensors(opt.state[p], ref_opt.state[q])
    assert sched.state_dict() == ref_sched.state_dict()
    fs.pipe(f"{url}/step-000003/adapter.safetensors", b"garbage")
    assert find_checkpoint("auto", url, quiet=True).endswith("step-000002")
    if url.startswith("memory://"):
        fs.rm("/vlrl-ckpt-test", recursive=True)


def _app():
    from vlrl.cli import app

    return app


def test_cli_resume_auto_continues_after_the_driver_was_killed(ci_model_dir, tmp_path):
    """`vlrl train --resume auto` starts a new run (nothing to resume), is SIGKILLed once it has
    a checkpoint, and the same command continues it to the end."""
    runs = tmp_path / "runs"
    args = [
        "train",
        "configs/ci-tiny.yaml",
        f"model.path={ci_model_dir}",
        f"storage.root={runs}",
        "storage.run_name=job",
        "runtime.backend=local",
        *FAST,
        "train.steps=3",
        "train.checkpoint_every=1",
        "--quiet",
        "--resume",
        "auto",
    ]
    driver = subprocess.Popen(
        [sys.executable, "-m", "vlrl.cli", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    latest = runs / "job" / "checkpoints" / "latest"
    deadline = time.monotonic() + 600
    while not latest.exists():
        assert driver.poll() is None, driver.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.kill(driver.pid, signal.SIGKILL)
    first_output = driver.communicate()[0]
    assert "starting the run from step 0" in first_output

    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    steps = [json.loads(line)["step"] for line in (runs / "job" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    events = [json.loads(line) for line in (runs / "job" / "run-events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "resume" and events[-1]["step"] >= 1 and "resumed from" in result.output
    assert (runs / "job" / "adapter" / "adapter_model.safetensors").is_file()
