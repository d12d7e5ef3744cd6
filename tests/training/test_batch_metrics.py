"""The honest batch metrics of a GRPO step (success over every sampled group, effective episodes,
optimizer steps) and the control arm that shuffles advantages within the batch."""

from __future__ import annotations

import torch
from run_compare import step_numbers

from vlrl.training.trainer import GRPOTrainer


def test_a_step_reports_sampled_success_effective_episodes_and_optimizer_steps(ci_config, tmp_path):
    cfg = ci_config("algo.ppo_epochs=2", "algo.mini_batch_size=4", "train.steps=1")
    trainer = GRPOTrainer(cfg, tmp_path / "run")
    trainer.setup()
    v = trainer.step().values
    episodes = cfg.algo.tasks_per_step * cfg.algo.group_size
    # no dynamic sampling: every sampled group is kept, so the two views agree
    assert v["rollout/episodes_all"] == episodes
    assert v["rollout/success_all"] == v["episode/success"] and v["rollout/reward_all"] == v["reward/mean"]
    assert v["train/optimizer_steps"] == 2 * (episodes // 4)  # ppo_epochs x mini-batches
    assert 0 <= v["train/effective_episodes"] <= episodes


def test_dynamic_sampling_keeps_the_dropped_groups_in_the_sampled_figures(ci_config, tmp_path):
    # An untrained model with the terminal reward only: every group is all zeros, all are dropped.
    cfg = ci_config(
        "algo.dynamic_sampling=true", "algo.max_resample_rounds=1", "env.rewards.progress=0", "train.steps=1"
    )
    trainer = GRPOTrainer(cfg, tmp_path / "ds")
    trainer.setup()
    v = trainer.step().values
    assert v["groups/dropped"] == 2 * cfg.algo.tasks_per_step
    assert "episode/success" not in v  # no kept group: the kept-group figures have nothing to describe
    assert v["rollout/episodes_all"] == 2 * cfg.algo.tasks_per_step * cfg.algo.group_size
    assert v["rollout/success_all"] == 0.0 and v["rollout/reward_all"] == 0.0


def test_shuffled_advantages_are_a_seeded_permutation_and_resume_exactly(ci_config, tmp_path):
    cfg = ci_config("algo.shuffle_advantages=true", "train.steps=3")
    a = GRPOTrainer(cfg, tmp_path / "a")
    a.setup()
    adv = [float(i) for i in range(8)]
    first = a.shuffled(adv)
    assert sorted(first) == adv and first != adv and a.shuffled(adv) == first  # same step, same permutation
    a.step()
    assert a.shuffled(adv) != first  # another step, another permutation
    a.step()
    path = a.save_checkpoint()
    b = GRPOTrainer(cfg, tmp_path / "b")
    b.setup()
    b.load_checkpoint(path.parent)
    ma, mb = a.step().values, b.step().values
    assert step_numbers([ma]) == step_numbers([mb])
    sa, sb = a.worker.adapter_state(), b.worker.adapter_state()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_control_arm_refuses_per_turn_advantages(ci_config):
    import pytest

    from vlrl.errors import ConfigError

    with pytest.raises(ConfigError, match="shuffle_advantages permutes episode-level advantages"):
        ci_config("algo.shuffle_advantages=true", "algo.step_advantage_weight=1.0")
