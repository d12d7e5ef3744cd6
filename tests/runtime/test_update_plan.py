"""The data-parallel update plan and the runtime's cheap checks (no Ray started here)."""

from __future__ import annotations

import random
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlrl.config import AlgoConfig, RuntimeConfig, load_config
from vlrl.errors import ConfigError, VlrlError
from vlrl.runtime.cluster import _probe, cluster_address, set_auth_mode
from vlrl.runtime.update_plan import combine_update_stats, make_update_plans, split_evenly
from vlrl.runtime.worker_group import rank_seed


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    world=st.integers(1, 5),
    micro=st.integers(1, 4),
    micro_per_mini=st.integers(1, 4),
    epochs=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    agg=st.sampled_from(["token_mean", "seq_mean_token_mean"]),
)
def test_plans_cover_each_mini_batch_once_with_equal_pass_counts(n, world, micro, micro_per_mini, epochs, seed, agg):
    algo = AlgoConfig(mini_batch_size=micro * micro_per_mini, micro_batch_size=micro, ppo_epochs=epochs, loss_agg=agg)
    sizes = [random.Random(seed + i).choice([0, 3, 7]) for i in range(n)]
    plans = make_update_plans(sizes, seed, algo, world)
    one = make_update_plans(sizes, seed, algo, 1)[0]
    assert len(plans) == world
    # Same number of optimizer steps, micro-batch passes per step and scoring passes everywhere.
    assert len({len(p.steps) for p in plans}) == 1 and len(plans[0].steps) == len(one.steps)
    for s in range(len(one.steps)):
        assert len({len(p.steps[s]) for p in plans}) == 1
        # The workers' micro-batches together are exactly the one-worker mini-batch, in order.
        merged = [i for p in plans for micro_batch in p.steps[s] for i in micro_batch]
        assert merged == [i for micro_batch in one.steps[s] for i in micro_batch]
        assert all(len(m) <= micro for p in plans for m in p.steps[s])
    assert len({p.score_passes for p in plans}) == 1
    assert all(p.denominators == one.denominators for p in plans)
    for p in plans:  # a worker holds what its micro-batches use, and can score it in score_passes
        used = {i for step in p.steps for m in step for i in m}
        assert used <= set(p.indices) and p.indices == sorted(p.indices)
        assert -(-len(p.indices) // micro) <= p.score_passes


def test_one_worker_plan_is_the_single_process_order():
    algo = AlgoConfig(mini_batch_size=4, micro_batch_size=2, ppo_epochs=2)
    plan = make_update_plans([5] * 6, seed=3, algo=algo)[0]
    rng = random.Random(3)
    expected = []
    for _ in range(2):
        order = list(range(6))
        rng.shuffle(order)
        expected += [[order[m : m + 4][k : k + 2] for k in range(0, len(order[m : m + 4]), 2)] for m in range(0, 6, 4)]
    assert plan.steps == expected and plan.indices == list(range(6)) and plan.denominators == [20, 10, 20, 10]


def test_split_evenly_and_stats_merge():
    assert split_evenly(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_evenly([1], 3) == [[1], [], []]
    partial = [[{"loss": 0.25, "grad_norm": 2.0, "lr": 0.1}], [{"loss": 0.5, "grad_norm": 2.0, "lr": 0.1}]]
    assert combine_update_stats(partial) == {"loss": 0.75, "grad_norm": 2.0, "lr": 0.1}
    assert rank_seed(7, 0) == 7 and rank_seed(7, 1) != 7 and rank_seed(None, 3) is None


def test_runtime_config_and_address_errors_are_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="needs backend 'ray'"):
        load_config(None, ["runtime.backend=local", "runtime.num_workers=2"])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address(RuntimeConfig()) is None
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    with pytest.raises(VlrlError, match="dashboard"):
        cluster_address(RuntimeConfig())
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(VlrlError, match="cannot reach a Ray cluster"):
        _probe(f"127.0.0.1:{port}", timeout_s=2)


def test_auth_mode_is_always_set_explicitly(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    assert set_auth_mode(joining=True) == "disabled"  # no token to offer a cluster
    monkeypatch.delenv("RAY_AUTH_MODE")
    assert set_auth_mode(joining=False) == "token"  # our own local instance: Ray's secure default
    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")
    assert set_auth_mode(joining=True) == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "bogus")
    with pytest.raises(VlrlError, match="not a Ray auth mode"):
        set_auth_mode(joining=True)
