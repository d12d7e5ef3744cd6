"""GRPO training on the tiny model: reproducibility, learning, checkpoints, SFT, the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from run_compare import step_numbers
from typer.testing import CliRunner

from vlrl.envs.base import StepResult, build_split, make_env, register_env
from vlrl.envs.maze.env import MazeEnv, parse_action
from vlrl.rollout.static_decoder import StaticDecoder
from vlrl.training.trainer import GRPOTrainer


@register_env("test_up")
class GoUpEnv(MazeEnv):
    """A trivially learnable reward for the learning test: 1 when the first action is `up`.

    One turn per episode; it reuses the maze's tasks and images, only the reward differs. A
    model that answers in the action format picks `up` about a quarter of the time at first.
    """

    def step(self, action_text: str) -> StepResult:
        result = super().step(action_text)
        return StepResult(None, float(parse_action(action_text) == "up"), True, result.info)


@pytest.fixture(scope="module")
def formatted_model_dir(ci_model_dir, tmp_path_factory):
    """The ci model after a short full SFT: it answers `<action>...</action>` (a random model's
    tiny output embeddings cannot be steered by LoRA alone, a pretrained model's can)."""
    from vlrl.config import load_config
    from vlrl.training.sft import run_sft

    cfg = load_config(
        "configs/ci-tiny.yaml",
        [
            f"model.path={ci_model_dir}",
            "runtime.backend=local",
            "train.sft.mode=full",
            "train.sft.episodes=128",
            "train.sft.epochs=4",
            "train.sft.batch_size=8",
            "train.sft.lr=2e-3",
        ],
    )
    return run_sft(cfg, tmp_path_factory.mktemp("sft") / "model")


def test_seeded_run_is_bit_for_bit_reproducible(ci_config, formatted_model_dir, tmp_path):
    runs = []
    for name in ("a", "b"):
        cfg = ci_config(
            f"model.path={formatted_model_dir}", "env.name=test_up", "train.steps=2", f"storage.run_name={name}"
        )
        trainer = GRPOTrainer(cfg, tmp_path / name)
        trainer.setup()
        for _ in range(2):
            trainer.step()
        runs.append((trainer.worker.adapter_state(), step_numbers(trainer.history)))
    (sa, ha), (sb, hb) = runs
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert ha == hb
    # and the update did change the adapter
    assert any(float(v.abs().sum()) > 0 for k, v in sa.items() if "lora_B" in k)


def test_grpo_increases_a_trivially_learnable_reward(ci_config, formatted_model_dir, tmp_path):
    cfg = ci_config(
        f"model.path={formatted_model_dir}",
        "env.name=test_up",
        "train.steps=10",
        "train.lr=2e-3",
        "algo.group_size=8",
        "algo.tasks_per_step=8",
        "algo.mini_batch_size=64",
        "algo.micro_batch_size=32",
    )
    trainer = GRPOTrainer(cfg, tmp_path / "learn")
    trainer.setup()
    steps = [trainer.step().values for _ in range(cfg.train.steps)]
    rewards = [v["reward/mean"] for v in steps]
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.25, rewards
    # A learnable reward gives groups with signal, and each such step says where it came from.
    shares = [v["groups/rare_best"] for v in steps if "groups/rare_best" in v]
    assert shares and all(0.0 <= x <= 1.0 for x in shares), steps


def test_gigpo_gives_each_turn_its_own_advantage(ci_config, formatted_model_dir, tmp_path):
    """GiGPO on real multi-turn mazes: step-level advantages are computed over same-state turns
    and reach the loss, and they change the update (the adapter differs from plain GRPO's)."""
    adapters = {}
    for weight in (0.0, 1.0):
        cfg = ci_config(
            f"model.path={formatted_model_dir}",
            "train.steps=1",
            "env.max_turns=4",
            f"algo.step_advantage_weight={weight}",
            f"storage.run_name=w{weight}",
        )
        trainer = GRPOTrainer(cfg, tmp_path / f"w{weight}")
        trainer.setup()
        m = trainer.step()
        adapters[weight] = trainer.worker.adapter_state()
        assert all(torch.isfinite(torch.tensor(v)) for k, v in m.values.items() if k.startswith("train/"))
        trainer.close()
    # Every group's G first turns see the same observation, so at least one turn per episode is
    # anchored: the share is at least episodes / turns = 1 / mean turns (more when later turns meet).
    anchored, mean_turns = m.values["advantage/anchored_turns"], m.values["episode/turns"]
    assert 0.0 <= m.values.get("groups/rare_best", 0.0) <= 1.0
    assert mean_turns > 1 and anchored >= 1 / mean_turns - 1e-9, (anchored, mean_turns)
    a, b = adapters[0.0], adapters[1.0]
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_dynamic_sampling_drops_groups_without_signal(ci_config, tmp_path):
    # With the maze's terminal reward and an untrained model, every group is all zeros.
    cfg = ci_config(
        "algo.dynamic_sampling=true", "algo.max_resample_rounds=1", "env.rewards.progress=0", "train.steps=1"
    )
    trainer = GRPOTrainer(cfg, tmp_path / "ds")
    trainer.setup()
    values = trainer.step().values
    assert values["groups/dropped"] == 2 * cfg.algo.tasks_per_step
    assert "time/update_s" not in values  # nothing left to learn from, so no update ran


def test_checkpoint_restores_adapter_optimizer_sampler_and_step(ci_config, tmp_path):
    cfg = ci_config("train.steps=3")
    a = GRPOTrainer(cfg, tmp_path / "ck")
    a.setup()
    a.step()
    a.step()
    path = a.save_checkpoint()
    b = GRPOTrainer(cfg, tmp_path / "ck2")
    b.setup()
    b.load_checkpoint(path.parent)  # through the `latest` pointer
    assert b.step_idx == 2 and b.sampler.state_dict() == a.sampler.state_dict()
    sa, sb = a.worker.adapter_state(), b.worker.adapter_state()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    ma, mb = a.step().values, b.step().values
    assert step_numbers([ma]) == step_numbers([mb])


def test_sft_clones_the_oracle_and_writes_an_adapter(ci_config, tmp_path):
    from vlrl.models.lora import read_adapter_record
    from vlrl.training.sft import run_sft

    cfg = ci_config("train.sft.episodes=16", "train.sft.epochs=3", "train.sft.batch_size=8")
    losses = []
    out = run_sft(cfg, tmp_path / "sft", lambda s, n, loss: losses.append(loss))
    # LoRA alone moves a random model's tiny output embeddings slowly (see bench/RESULTS.md):
    # about 7.1 -> 6.0 in these 6 steps.
    assert losses[-1] < losses[0] - 0.5, losses
    assert read_adapter_record(out)["base_fingerprint"].startswith("sha256:")
    # GRPO can start from it
    trainer = GRPOTrainer(ci_config("train.steps=1"), tmp_path / "from-sft", init_adapter=str(out))
    trainer.setup()
    trainer.step()


def test_sft_stops_at_its_target_loss(ci_config, tmp_path):
    from vlrl.training.sft import TARGET_WINDOW, reached_target, run_sft

    flat = [{"loss": 0.25}] * (TARGET_WINDOW - 1)
    assert not reached_target(flat, 0.5)  # not before a full window
    assert reached_target(flat + [{"loss": 0.25}], 0.5) and not reached_target(flat + [{"loss": 0.25}], 0.25)
    assert not reached_target(flat * 3, None)
    # 4 transcripts a step, 8 epochs of 16: 32 steps planned; a target every step meets ends at the window.
    cfg = ci_config(
        "train.sft.episodes=16", "train.sft.epochs=8", "train.sft.batch_size=4", "train.sft.target_loss=1000"
    )
    out = run_sft(cfg, tmp_path / "sft")
    assert len(json.loads((out / "sft_history.json").read_text())) == TARGET_WINDOW


def _snapshot(root) -> dict:
    """Every path under `root` (itself included) with its bytes (files) and modification time."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in [root, *sorted(root.rglob("*"))]
    }


def _cli_sft(base, tmp_path, out, *args: str):
    from vlrl.cli import app

    return CliRunner().invoke(
        app,
        [
            "sft",
            "configs/ci-tiny.yaml",
            f"model.path={base}",
            f"storage.root={tmp_path / 'runs'}",
            "runtime.backend=local",
            "-o",
            str(out),
            *args,
        ],
    )


def test_cli_sft_refuses_an_output_that_holds_files_or_is_the_base_and_touches_nothing(ci_model_dir, tmp_path):
    import shutil

    from vlrl.errors import VlrlError

    base = tmp_path / "models" / "base"
    shutil.copytree(ci_model_dir, base)  # a copy: a check that failed would replace it, not the session's model
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    cases = [
        (taken, [], "already exists and is not empty; choose a new directory or overwrite it (--overwrite)"),
        (base, ["--overwrite"], "is the base model itself"),
        (base.parent, ["--overwrite"], "holds the base model"),
        (taken / "notes.txt", ["--overwrite"], "is a file, not a directory"),
        (base, ["train.sft.mode=full", "--overwrite"], "is the base model itself"),
    ]
    before = {d: _snapshot(d) for d in (taken, tmp_path / "models")}
    for out, args, message in cases:
        result = _cli_sft(base, tmp_path, out, *args)
        assert isinstance(result.exception, VlrlError), (out, result.output)
        assert message in str(result.exception) and "\n" not in str(result.exception), str(result.exception)
        assert {d: _snapshot(d) for d in before} == before, out  # nothing written, removed or changed
    assert not (tmp_path / "runs").exists()


def test_cli_sft_overwrite_replaces_an_output_that_holds_files(ci_model_dir, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    result = _cli_sft(ci_model_dir, tmp_path, taken, "train.sft.episodes=8", "--overwrite")
    assert result.exit_code == 0, result.output
    assert not (taken / "notes.txt").exists()
    assert (taken / "adapter_model.safetensors").is_file() and (taken / "lineage.json").is_file()
    assert len(json.loads((taken / "sft_history.json").read_text())) == 1


def test_cli_train_writes_adapter_metrics_and_evaluation(ci_config, ci_model_dir, tmp_path):
    from vlrl.cli import app

    runs = tmp_path / "cli-runs"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "configs/ci-tiny.yaml",
            f"model.path={ci_model_dir}",
            f"storage.root={runs}",
            "storage.run_name=cli",
            "train.steps=2",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    run = runs / "cli"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    evals = json.loads((run / "evals.json").read_text())
    final = evals[-1]  # the evaluation of the saved adapter: step 2, on the 8 holdout mazes
    assert (final["step"], final["split"], final["n"]) == (2, "holdout", 8)
    assert final["success_rate"] == final["successes"] / 8
    assert "step 2/2 |" in result.output


def test_bad_input_is_one_clear_line(ci_config, tmp_path):
    from vlrl.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["train", "configs/ci-tiny.yaml", "model.path=/no/such/model", "model.init_tiny=null"])
    assert r.exit_code != 0 and "does not exist" in str(r.exception)
    r = runner.invoke(app, ["train", "configs/ci-tiny.yaml", "--init-adapter", str(tmp_path / "missing")])
    assert r.exit_code != 0 and "is not a directory" in str(r.exception)


def test_the_vision_cache_changes_nothing_a_run_computes(ci_config, formatted_model_dir, tmp_path):
    """GRPO through the fast path (forced on CPU) with a vision-tower LoRA, the vision cache on and
    off: the same numbers. Each step trains the vision LoRA, so an image whose features were
    cached before a step (the same pixel tensor: ChatFormat's image cache hands it out again for
    the same screen) must be encoded anew after it (a stale cache gives logits ~4e-3 off here).
    The worker's engine.sleep() before each update drops it."""
    runs = {}
    for mb in (0, 64):
        cfg = ci_config(
            f"model.path={formatted_model_dir}",
            "train.steps=3",
            "train.lr=1e-2",
            "rollout.fast_decode=true",
            "model.lora.include_vision=true",
            f"rollout.vision_cache_mb={mb}",
            f"storage.run_name=vc{mb}",
        )
        trainer = GRPOTrainer(cfg, tmp_path / f"vc{mb}")
        trainer.setup()
        history = [trainer.step().values for _ in range(cfg.train.steps - 1)]
        decoder = trainer.worker.engine._decoder
        env = make_env(cfg.env)
        prompts = [trainer.worker.chat.prompt(env.system_prompt, env.reset(build_split(cfg.env, "train")[0]))]
        pad = trainer.worker.pad_id
        with torch.no_grad():
            decoder._prefill(prompts, pad, torch.device("cpu"))  # its features are cached now
        history.append(trainer.step().values)  # trains the vision LoRA
        with torch.no_grad():
            fresh = StaticDecoder(trainer.worker.model, vision_cache_mb=0)._prefill(prompts, pad, torch.device("cpu"))[
                0
            ]
            served = decoder._prefill(prompts, pad, torch.device("cpu"))[0]
        torch.testing.assert_close(served, fresh, atol=1e-5, rtol=1e-5)  # not the features of the old weights
        runs[mb] = (step_numbers(history), decoder.vision_cache, trainer.worker.adapter_state())
    (off, _, state), (on, cache, _) = runs[0], runs[64]
    assert any(float(v.abs().sum()) > 0 for k, v in state.items() if "visual" in k and "lora_B" in k)
    # Hits within a rollout's turns; across an update nothing survives: the worker's engine.sleep()
    # empties the cache before each update, so the weight check (tests/rollout/test_vision_cache.py)
    # never finds old entries in a run.
    assert cache.hits > 0 and cache.invalidations == 0
    # The same samples, losses and updates. The sampler-vs-trainer log-prob gaps are rounding
    # noise (~1e-6) and move with any change of operation order, as the cached prefill's: small only.
    for a, b in zip(off, on, strict=True):
        assert a.keys() == b.keys()
        noise = [k for k in a if k.startswith("rollout/logprob_diff")]
        assert noise and all(max(a[k], b[k]) < 1e-4 for k in noise)
        same = [k for k in a if k not in noise]
        assert all(abs(a[k] - b[k]) <= 1e-6 * max(1.0, abs(a[k])) for k in same), {
            k: (a[k], b[k]) for k in same if a[k] != b[k]
        }
