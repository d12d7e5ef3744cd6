"""The Prometheus exporter and the resource readings, without a model: mapping, HTTP, ports, lifecycle."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vlrl.config import load_config
from vlrl.errors import VlrlError
from vlrl.observability import resources
from vlrl.observability.metrics import FAMILIES, RECORD_METRICS, MetricsExporter
from vlrl.runtime.update_plan import UpdateStats, combine_update_stats

# A record with the trainer's keys, as GRPOTrainer.step writes it (values made up but consistent).
RECORD = {
    "step": 4,
    "reward/mean": 0.25,
    "reward/std": 0.4,
    "episode/success": 0.25,
    "episode/turns": 3.0,
    "episode/invalid_actions": 0.75,
    "episode/wall_bumps": 0.3,
    "episode/response_tokens": 21.0,
    "episode/truncated": 0.0,
    "groups/dropped": 1.0,
    "groups/rare_best": 0.5,
    "rollout/success_all": 0.3,
    "rollout/reward_all": 0.2,
    "train/effective_episodes": 6.0,
    "train/optimizer_steps": 2.0,
    "train/loss": -0.01,
    "train/kl": 0.002,
    "train/entropy": 1.5,
    "train/clip_fraction": 0.05,
    "train/grad_norm": 0.8,
    "train/lr": 1e-3,
    "rollout/logprob_diff_mean": 0.04,
    "rollout/logprob_diff_max": 0.2,
    "rollout/kl_sampler_trainer_k3": 0.001,
    "time/rollout_s": 2.0,
    "time/generate_s": 1.5,
    "time/env_s": 0.25,
    "time/update_s": 1.0,
    "time/logprob_s": 0.25,
    "time/optim_s": 0.7,
    "time/sync_s": 0.01,
    "time/step_s": 3.1,
    "sync/transport_memory": 1.0,
    "sync/transport_disk": 0.0,
    "throughput/rollout_tokens_per_s": 112.0,
    "throughput/train_tokens_per_s": 900.0,
    "throughput/episodes_per_s": 4.0,
    "eval/success_rate": 0.5,
    "eval/success_low": 0.2,
    "eval/success_high": 0.8,
    "eval/n": 8.0,
    "eval/mean_turns": 4.0,
    "eval/invalid_rate": 0.1,
    "resource/1/host_memory_used_bytes": 2e9,
    "resource/1/gpu/3/utilization_percent": 80.0,
    "resource/1/gpu/3/memory_used_bytes": 5e9,
    "resource/1/gpu/3/memory_total_bytes": 8e10,
}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of an exposition text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def config():
    return load_config(None, ["train.steps=10", "tracking.exporter_port=0", "model.path=/models/tiny-ci"])


def test_every_mapped_record_key_becomes_its_metric_with_run_label(config):
    exporter = MetricsExporter(config, "r1", live_driver=False)
    exporter.publish(RECORD)
    got = samples(exporter.render())
    exporter.close()
    run = ("run", "r1")
    assert got[("vlrl_step", (run,))] == 4
    assert got[("vlrl_total_steps", (run,))] == 10
    assert got[("vlrl_reward_mean", (run,))] == 0.25
    assert got[("vlrl_clip_fraction", (run,))] == 0.05
    assert got[("vlrl_sampled_success_rate", (run,))] == 0.3 and got[("vlrl_sampled_reward_mean", (run,))] == 0.2
    assert got[("vlrl_effective_episodes", (run,))] == 6 and got[("vlrl_optimizer_steps", (run,))] == 2
    assert got[("vlrl_rollout_logprob_diff", (run, ("stat", "max")))] == 0.2
    assert got[("vlrl_rollout_sampler_kl", (run,))] == 0.001
    assert got[("vlrl_phase_seconds", (("phase", "logprob"), run))] == 0.25
    assert got[("vlrl_phase_seconds", (("phase", "optimizer"), run))] == 0.7
    assert got[("vlrl_tokens_per_second", (("kind", "train"), run))] == 900.0
    assert got[("vlrl_eval_success_bound", (("bound", "low"), run))] == 0.2
    assert got[("vlrl_eval_step", (run,))] == 4
    assert got[("vlrl_invalid_action_rate", (run,))] == pytest.approx(0.25)  # 0.75 per episode / 3 turns
    # counters from the rates: 4 episodes/s x 2 s, 112 tok/s x 1.5 s, 8 episodes x 3 turns
    assert got[("vlrl_episodes_total", (run,))] == 8
    assert got[("vlrl_generated_tokens_total", (run,))] == 168
    assert got[("vlrl_completions_total", (run,))] == 24
    assert got[("vlrl_response_tokens", (run,))] == pytest.approx(168 / 24)
    assert got[("vlrl_restarts_total", (run,))] == 0
    assert got[("vlrl_gpu_utilization_percent", (("gpu", "3"), run, ("worker", "1")))] == 80.0
    assert got[("vlrl_host_memory_used_bytes", (run, ("worker", "1")))] == 2e9
    info = [k for k in got if k[0] == "vlrl_run_info"]
    assert info and dict(info[0][1])["model"] == "tiny-ci"
    # every row of the mapping table was exercised by RECORD
    for keys, family, _ in RECORD_METRICS:
        if family not in ("vlrl_restarts",) and not keys[0].startswith("time/e") and keys[0] != "time/checkpoint_s":
            assert any(k in RECORD for k in keys), keys


def test_counters_add_up_and_gauges_keep_the_latest_step(config):
    exporter = MetricsExporter(config, "r1", live_driver=False)
    exporter.publish(RECORD)
    exporter.publish({**RECORD, "step": 5, "reward/mean": 0.5, "run/restarts": 2})
    got = samples(exporter.render())
    assert got[("vlrl_step", (("run", "r1"),))] == 5
    assert got[("vlrl_reward_mean", (("run", "r1"),))] == 0.5
    assert got[("vlrl_episodes_total", (("run", "r1"),))] == 16
    assert got[("vlrl_restarts_total", (("run", "r1"),))] == 2
    # eval values stay (the latest evaluation) on steps without one
    exporter.publish({"step": 6, "reward/mean": 0.1})
    assert samples(exporter.render())[("vlrl_eval_success_rate", (("run", "r1"),))] == 0.5


def test_guard_events_count_by_check_and_action(config):
    """`guard/<check>/<action>` record keys (training/guards.py) -> vlrl_guard_events_total; no
    series before the first event."""
    exporter = MetricsExporter(config, "r1", live_driver=False)
    exporter.publish(RECORD)
    assert not any(name.startswith("vlrl_guard") for name, _ in samples(exporter.render()))
    exporter.publish({**RECORD, "step": 5, "guard/grad_spike/skip": 1.0})
    exporter.publish({**RECORD, "step": 6, "guard/grad_spike/skip": 1.0, "guard/kl_max/stop": 1.0})
    got = {labels: v for (name, labels), v in samples(exporter.render()).items() if name == "vlrl_guard_events_total"}
    assert got == {
        (("action", "skip"), ("check", "grad_spike"), ("run", "r1")): 2.0,
        (("action", "stop"), ("check", "kl_max"), ("run", "r1")): 1.0,
    }


def test_missing_nan_and_non_numbers_are_absent_not_zero(config):
    exporter = MetricsExporter(config, "r1", live_driver=False)
    exporter.publish({"step": 1, "reward/mean": float("nan"), "train/kl": "x", "episode/success": True})
    names = {name for name, _ in samples(exporter.render())}
    assert "vlrl_step" in names
    assert not names & {
        "vlrl_reward_mean",
        "vlrl_kl",
        "vlrl_success_rate",
        "vlrl_eval_success_rate",
        "vlrl_episodes_total",
    }


def test_gpu_metrics_exist_only_where_a_gpu_reports(config):
    exporter = MetricsExporter(config, "r1")
    exporter.publish({"step": 1, **resources.resource_record(0, resources.snapshot())})
    names = {name for name, _ in samples(exporter.render())}
    gpu = {f.exposed for f in FAMILIES.values() if f.gpu_only}
    assert {"vlrl_host_memory_used_bytes", "vlrl_process_resident_memory_bytes"} <= names
    assert (names & gpu == set()) == (resources.gpu_readings() == {})


def test_served_over_http_on_a_free_port_with_its_own_registry(config):
    from prometheus_client import REGISTRY

    with MetricsExporter(config, "a") as a, MetricsExporter(config, "b") as b:
        assert a.port != b.port and a.url.startswith("http://127.0.0.1:")
        a.publish({"step": 1})
        b.publish({"step": 7})
        text_a = urllib.request.urlopen(a.url, timeout=5).read().decode()
        text_b = urllib.request.urlopen(b.url, timeout=5).read().decode()
        assert 'vlrl_step{run="a"} 1.0' in text_a and 'vlrl_step{run="b"} 7.0' in text_b
        # live driver memory at scrape time, labelled worker="driver"
        assert 'vlrl_process_resident_memory_bytes{run="a",worker="driver"}' in text_a
    assert REGISTRY.get_sample_value("vlrl_step", {"run": "a"}) is None  # the global registry stays clean
    with MetricsExporter(config, "again", port=a.port) as again:  # closed: the port can be served again
        assert again.port == a.port


def test_a_taken_port_is_one_clear_error(config):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(VlrlError, match=rf"tracking.exporter_port {port} on 127.0.0.1 is already in use"):
            MetricsExporter(config, "r1", port=port)


def test_no_port_serves_nothing(config):
    exporter = MetricsExporter(load_config(None, ["model.path=/m"]), "r1")
    assert exporter.port is None and exporter.url is None
    exporter.publish({"step": 1})
    assert "vlrl_step" in exporter.render()
    exporter.close()


def test_resource_snapshot_on_this_machine():
    reading = resources.snapshot()
    assert reading["process_resident_memory_bytes"] > 10e6
    assert 0 < reading["host_memory_used_bytes"] <= reading["host_memory_total_bytes"]
    monitor = resources.ResourceMonitor("2")
    snap = monitor.snapshot()
    monitor.close()
    assert snap["resource/2/host_memory_total_bytes"] == reading["host_memory_total_bytes"]
    if not resources.gpu_readings():  # CPU: no sampling thread, no gpu/* keys
        assert monitor._thread is None and not any("/gpu/" in k for k in snap)


def test_update_timings_ride_beside_the_stats():
    # Two workers, two optimizer steps: stats add up over workers and average over steps; timings
    # are the slowest worker's, summed over steps, and stay out of the stats dict.
    partial = [
        [
            {"loss": 0.25, "grad_norm": 2.0, "lr": 0.1, "time_optim_s": 1.0, "time_logprob_s": 0.5},
            {"loss": 0.25, "grad_norm": 1.0, "lr": 0.1, "time_optim_s": 2.0},
        ],
        [
            {"loss": 0.5, "grad_norm": 2.0, "lr": 0.1, "time_optim_s": 1.5, "time_logprob_s": 0.75},
            {"loss": 0.25, "grad_norm": 1.0, "lr": 0.1, "time_optim_s": 1.0},
        ],
    ]
    stats = combine_update_stats(partial)
    assert isinstance(stats, UpdateStats)
    assert stats == {"loss": 0.625, "grad_norm": 1.5, "lr": 0.1}
    assert stats.timings == {"optim_s": 3.5, "logprob_s": 0.75}
