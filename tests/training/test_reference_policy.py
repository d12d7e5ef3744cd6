"""The KL reference of a run that starts from a warm-start adapter (`--init-adapter`) is that
adapter, frozen; without one it is the base (adapter disabled)."""

from __future__ import annotations

import torch

from vlrl.algo.grpo import kl_k3
from vlrl.envs.base import build_split
from vlrl.models.fingerprint import model_fingerprint
from vlrl.models.loading import load_policy_model
from vlrl.models.lora import apply_lora, save_adapter
from vlrl.training.worker import Worker


def _warm_start(model_dir, out):
    """An adapter whose weights all differ from zero, as an SFT run would leave it."""
    model = apply_lora(load_policy_model(model_dir), 4, 8.0, seed=0)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return save_adapter(model, out, model_fingerprint(model_dir))


def _masked(scored, episodes):
    return [lp[torch.tensor(e.sequence.loss_mask[1:], dtype=torch.bool)] for lp, e in zip(scored, episodes)]


def test_kl_to_the_warm_start_is_exactly_zero_before_the_first_update_and_its_adapter_stays_frozen(
    ci_config, ci_model_dir, tmp_path
):
    """KL == 0.0 exactly (fp32, not to a tolerance) before the first update on the --init-adapter
    path; the reference is the warm start, not the base; training moves the policy but not the
    reference; the saved adapter holds the trained adapter only."""
    adapter = _warm_start(ci_model_dir, tmp_path / "sft")
    worker = Worker(ci_config("algo.kl_coef=0.1", "algo.ppo_epochs=2", "train.lr=0.01"), 4, adapter_dir=str(adapter))
    assert worker.policy.reference_adapter == "reference"
    assert not any(".reference." in n for n, p in worker.model.named_parameters() if p.requires_grad)
    tasks = list(build_split(worker.config.env, "train"))[:2]
    episodes = worker.rollout(tasks, 2, worker.sampling_params(seed=3))
    seqs = [e.sequence for e in episodes]

    policy = _masked(worker.policy.score_no_grad(seqs, with_adapter=True), episodes)
    reference = _masked(worker.policy.score_no_grad(seqs, with_adapter=False), episodes)
    for a, b in zip(policy, reference):
        assert torch.equal(a, b)
        assert float(kl_k3(a, b).abs().max()) == 0.0
    with worker.model.disable_adapter():  # the base scores the same tokens differently: the reference is not the base
        base = _masked(worker.policy.score_no_grad(seqs, with_adapter=True), episodes)
    assert max(float((a - b).abs().max()) for a, b in zip(policy, base)) > 1e-3

    stats = worker.update(
        episodes, torch.randn(len(episodes), generator=torch.Generator().manual_seed(0)).tolist(), seed=0
    )
    assert stats["kl"] > 0.0  # the first epoch's step moved the policy off the reference before the second's
    after = _masked(worker.policy.score_no_grad(seqs, with_adapter=True), episodes)
    again = _masked(worker.policy.score_no_grad(seqs, with_adapter=False), episodes)
    assert max(float((a - b).abs().max()) for a, b in zip(after, policy)) > 1e-4  # the policy moved
    for a, b in zip(again, reference):
        assert torch.equal(a, b)  # the reference did not

    saved = worker.save_adapter(tmp_path / "grpo")
    assert not (saved / "reference").exists() and (saved / "adapter_model.safetensors").is_file()


def test_without_a_warm_start_or_a_kl_term_no_reference_adapter_is_loaded(ci_config, ci_model_dir, tmp_path):
    assert Worker(ci_config("algo.kl_coef=0.1"), 4).policy.reference_adapter is None
    adapter = _warm_start(ci_model_dir, tmp_path / "sft")
    assert Worker(ci_config("algo.kl_coef=0"), 4, adapter_dir=str(adapter)).policy.reference_adapter is None


def test_from_the_base_the_kl_is_exactly_zero_before_the_first_update(ci_config):
    """Without a warm start the reference is the base (adapter disabled); a fresh adapter (lora_B
    zero) adds exact zeros, so policy and reference log-probs are equal, not merely close."""
    worker = Worker(ci_config("algo.kl_coef=0.1"), 4)
    episodes = worker.rollout(list(build_split(worker.config.env, "train"))[:2], 2, worker.sampling_params(seed=3))
    seqs = [e.sequence for e in episodes]
    policy = _masked(worker.policy.score_no_grad(seqs, with_adapter=True), episodes)
    reference = _masked(worker.policy.score_no_grad(seqs, with_adapter=False), episodes)
    assert sum(len(a) for a in policy) > 0
    for a, b in zip(policy, reference):
        assert torch.equal(a, b)
        assert float(kl_k3(a, b).abs().max()) == 0.0
