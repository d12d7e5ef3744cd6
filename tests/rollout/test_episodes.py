"""The transformers engine and the episode driver on the tiny model and real mazes."""

from __future__ import annotations

import math

import pytest
import torch

from vlrl.envs.base import build_split, make_env, replay_trace
from vlrl.rollout.episodes import RolloutStats
from vlrl.training.worker import Worker


def _episodes(ci_config, *overrides, tasks=2, group=4, seed=1):
    cfg = ci_config(*overrides)
    worker = Worker(cfg, total_optimizer_steps=4)
    split = build_split(cfg.env, "train")
    stats = RolloutStats()
    eps = worker.rollout([split[i] for i in range(tasks)], group, worker.sampling_params(seed=seed), stats)
    return worker, eps, stats


def test_multi_turn_episodes_record_tokens_masks_and_traces(ci_config):
    worker, eps, stats = _episodes(ci_config)
    assert len(eps) == 8 and [e.group for e in eps] == [0] * 4 + [1] * 4
    tok = worker.processor.tokenizer
    image_pad = tok.convert_tokens_to_ids("<|image_pad|>")
    for e in eps:
        s = e.sequence
        assert len(s.token_ids) == len(s.loss_mask) == len(s.logprobs) == len(s.mm_token_type_ids)
        # Mask 1 spans are exactly the model's responses, turn by turn, and nothing else.
        spans, cur = [], []
        for t, m in zip(s.token_ids, s.loss_mask):
            if m:
                cur.append(t)
            elif cur:
                spans.append(cur)
                cur = []
        if cur:
            spans.append(cur)
        turns = e.trace["turns"]
        assert len(spans) == len(turns) == len(e.turn_rewards) == len(e.turn_states)
        assert [s.token_ids[a:b] for a, b in s.response_spans] == spans  # what per-turn advantages use
        # The state a turn acted on is its observation, picture and text: it stays the same exactly
        # when the agent did not move and the feedback repeated (the same bump twice); the first
        # turn's state is shared by the whole group.
        positions = [e.trace["maze"]["start"]] + [t["position"] for t in turns]
        texts = ["(instruction)"] + [t["feedback"] for t in turns]
        for k in range(1, len(turns)):
            same = positions[k] == positions[k - 1] and texts[k] == texts[k - 1]
            assert (e.turn_states[k] == e.turn_states[k - 1]) == same
        assert e.turn_states[0] == eps[e.group * 4].turn_states[0]
        for span, turn in zip(spans, turns):
            assert tok.decode(span, skip_special_tokens=True) == turn["response"]
        masked = [t for t, m in zip(s.token_ids, s.loss_mask) if m]
        assert image_pad not in masked and tok.convert_tokens_to_ids("<|im_start|>") not in masked
        # One image per turn that was observed, each with its own placeholder tokens.
        assert len(s.images) == len(s.pixel_values) == len(s.image_grid_thw)
        assert sum(s.mm_token_type_ids) == sum(int(g.prod()) // 4 for g in s.image_grid_thw)
        # The trace alone re-verifies the episode's outcome.
        replay = replay_trace(e.trace)
        assert replay["matches"], replay
        assert abs(replay["return"] - e.reward) < 1e-9
    assert stats.generated_tokens == sum(sum(e.sequence.loss_mask) for e in eps)


def test_rescored_logprobs_match_the_engine(ci_config):
    worker, eps, _ = _episodes(ci_config)
    rescored = worker.policy.score_no_grad([e.sequence for e in eps])
    worst = 0.0
    for e, lp in zip(eps, rescored):
        mask = torch.tensor(e.sequence.loss_mask[1:], dtype=torch.bool)
        sampled = torch.tensor(e.sequence.logprobs[1:])
        worst = max(worst, float((lp[mask] - sampled[mask]).abs().max()))
    assert worst < 1e-4, worst


def test_kl_to_reference_is_exactly_zero_before_the_first_update(ci_config):
    from vlrl.algo.grpo import kl_k3

    worker, eps, _ = _episodes(ci_config, tasks=1, group=2)
    seqs = [e.sequence for e in eps]
    with_adapter = worker.policy.score_no_grad(seqs, with_adapter=True)
    reference = worker.policy.score_no_grad(seqs, with_adapter=False)
    for a, b, e in zip(with_adapter, reference, eps):
        mask = torch.tensor(e.sequence.loss_mask[1:], dtype=torch.bool)
        assert torch.equal(a[mask], b[mask])
        assert float(kl_k3(a[mask], b[mask]).abs().max()) == 0.0


def test_exploring_starts_try_each_legal_first_move_and_train_on_them(ci_config):
    worker, eps, _ = _episodes(ci_config, "algo.exploring_starts=true", tasks=3, group=4)
    for g in range(3):
        group = eps[4 * g : 4 * g + 4]
        env = make_env(worker.config.env)
        env.reset(group[0].task)
        legal = env.legal_responses()
        forced = min(len(legal), 4)
        firsts = [e.trace["turns"][0]["response"] for e in group]
        # Every legal first move is tried once (as many as the group holds); the rest sample.
        assert len(set(firsts[:forced])) == forced and set(firsts[:forced]) <= set(legal)
        assert not any(e.trace["turns"][0]["bumped"] for e in group[:forced])
        for k, e in enumerate(group):
            s, (a, b) = e.sequence, e.sequence.response_spans[0]
            # A forced move is not a sample: no sampling log-prob; a sampled one has its own.
            assert all(math.isnan(x) for x in s.logprobs[a:b]) == (k < forced)
            assert all(math.isfinite(x) for x in s.logprobs[b:])
            assert replay_trace(e.trace)["matches"]
    # The update takes the forced first moves like sampled ones (the ratio against the trainer's old
    # log-probs), and the sampler/trainer gap skips them instead of turning NaN.
    rewards = torch.tensor([e.reward for e in eps])
    advantages = [float(x) for x in rewards - rewards.mean()]
    update = worker.update(eps, advantages, seed=0)
    assert all(math.isfinite(v) for v in update.values()), update


def test_exploring_starts_need_trainer_logprobs_and_an_env_that_lists_its_moves(ci_config, tmp_path):
    from vlrl.errors import VlrlError
    from vlrl.training.trainer import GRPOTrainer

    for bad in ("algo.old_logprobs=sampler", "algo.rollout_correction=tis"):
        with pytest.raises(VlrlError, match="exploring_starts: the forced first moves have no sampling log-probs"):
            ci_config("algo.exploring_starts=true", bad)
    trainer = GRPOTrainer(ci_config("algo.exploring_starts=true", "env.name=maze_plan"), tmp_path / "run")
    with pytest.raises(VlrlError, match="algo.exploring_starts needs env 'maze_plan' to list its legal moves"):
        trainer.setup()
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_greedy_generation_is_deterministic_and_plan_variant_runs(ci_config):
    _, first, _ = _episodes(ci_config, "env.name=maze_plan", tasks=2, group=2, seed=5)
    _, again, _ = _episodes(ci_config, "env.name=maze_plan", tasks=2, group=2, seed=5)
    assert [e.sequence.token_ids for e in first] == [e.sequence.token_ids for e in again]
    assert all(len(e.turn_rewards) == 1 for e in first)


def test_response_spans_follow_appends_extends_and_copies():
    from vlrl.rollout.sequence import MultimodalSequence

    def piece(n: int) -> MultimodalSequence:
        return MultimodalSequence([7] * n, [0] * n, [0.0] * n, [0] * n)

    seq = piece(3)
    seq.append_sampled([1, 2], [-0.1, -0.2])
    seq.extend(piece(2))
    seq.append_sampled([3], [-0.3])
    assert seq.response_spans == [(3, 5), (7, 8)]
    other = piece(1)
    other.extend(seq.copy())  # spans move with the tokens
    assert other.response_spans == [(4, 6), (8, 9)] and seq.copy().response_spans == seq.response_spans
