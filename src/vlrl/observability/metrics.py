"""Prometheus metrics of a training run: the trainer's step record, served over HTTP.

    exporter = MetricsExporter(config, run_name)     # serves http://<exporter_host>:<port>/metrics
    exporter.publish(record)                         # once per step: the dict written to metrics.jsonl
    exporter.close()

Every metric carries the label `run`; per-worker resources also carry `worker` (and `gpu`).
The mapping from record keys to metric families is the table `FAMILIES` + `RECORD_METRICS`
below, and docs/observability.md lists the same table (a test keeps them equal). Values are the
latest step's (gauges) or running totals (counters, `_total`); a value the run has not produced
yet (e.g. no evaluation so far) is absent, never a made-up zero.

The exporter has its own `CollectorRegistry` (not prometheus_client's global one), so two runs in
one process, or tests, never share series. It is a custom collector: at each scrape it renders
the latest record, plus the driver's live host memory (worker="driver").

Derived values, when the record lacks the explicit key (the trainer may add it later):
  episodes      rollout/episodes        else throughput/episodes_per_s x time/rollout_s
  gen. tokens   rollout/generated_tokens else throughput/rollout_tokens_per_s x time/generate_s
  completions   rollout/completions     else episodes x episode/turns (one completion per turn in
                                         the multi-turn maze; not in the plan variant)
  train tokens  train/tokens            else throughput/train_tokens_per_s x time/update_s

Stability guard events (`guard/<check>/<action>` record keys, `vlrl.training.guards`) count into
`vlrl_guard_events_total{check, action}`; the series appears with a run's first event.
"""

from __future__ import annotations

import errno
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vlrl.errors import VlrlError
from vlrl.observability.resources import host_memory

PREFIX = "vlrl_"


@dataclass(frozen=True)
class Family:
    """One metric family: its name (counters without `_total`), type, help and extra labels."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...] = ()
    gpu_only: bool = False

    @property
    def exposed(self) -> str:
        """The name Prometheus stores (counters gain `_total`)."""
        return self.name + "_total" if self.kind == "counter" else self.name


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        # run
        Family("vlrl_step", "gauge", "Training steps completed."),
        Family("vlrl_total_steps", "gauge", "Steps the run is configured for (train.steps)."),
        Family("vlrl_last_step_timestamp_seconds", "gauge", "Unix time at which the latest step finished."),
        Family(
            "vlrl_run_info",
            "gauge",
            "Always 1; labels describe the run.",
            ("model", "env", "engine", "backend", "workers"),
        ),
        Family("vlrl_restarts", "counter", "Times the run was restarted or resumed (run/restarts)."),
        Family(
            "vlrl_guard_events",
            "counter",
            "Stability guard events by check and the action taken (train.guards).",
            ("check", "action"),
        ),
        # learning
        Family("vlrl_reward_mean", "gauge", "Mean episode return of the step's rollouts."),
        Family("vlrl_reward_std", "gauge", "Standard deviation of the step's episode returns."),
        Family("vlrl_success_rate", "gauge", "Fraction of the step's episodes that reached the goal (sampled)."),
        Family("vlrl_episode_turns", "gauge", "Mean episode length in turns."),
        Family("vlrl_episode_invalid_actions", "gauge", "Mean invalid actions per episode."),
        Family("vlrl_episode_wall_bumps", "gauge", "Mean wall bumps per episode."),
        Family("vlrl_invalid_action_rate", "gauge", "Invalid actions per turn."),
        Family("vlrl_wall_bump_rate", "gauge", "Wall bumps per turn."),
        Family(
            "vlrl_episode_response_tokens", "gauge", "Mean tokens the policy generated per episode (all its turns)."
        ),
        Family("vlrl_response_tokens", "gauge", "Mean generated tokens per completion (response length)."),
        Family("vlrl_truncation_rate", "gauge", "Fraction of episodes cut off by rollout.max_model_len."),
        Family("vlrl_groups_dropped", "gauge", "Groups dropped by dynamic sampling in the step."),
        Family(
            "vlrl_sampled_success_rate",
            "gauge",
            "Fraction of ALL the step's sampled episodes that reached the goal, dropped groups included.",
        ),
        Family(
            "vlrl_sampled_reward_mean",
            "gauge",
            "Mean episode return of ALL the step's sampled episodes, dropped groups included.",
        ),
        Family("vlrl_effective_episodes", "gauge", "Episodes of the step's update with a nonzero advantage."),
        Family("vlrl_optimizer_steps", "gauge", "Optimizer steps of the step's update (ppo_epochs x mini-batches)."),
        Family(
            "vlrl_groups_rare_best",
            "gauge",
            "Of the groups with signal, the share whose best reward fewer than half the episodes reached.",
        ),
        Family("vlrl_loss", "gauge", "Policy loss (mean over optimizer steps)."),
        Family("vlrl_kl", "gauge", "k3 KL to the reference policy."),
        Family("vlrl_entropy", "gauge", "Mean token entropy of the policy on sampled tokens."),
        Family("vlrl_clip_fraction", "gauge", "Fraction of tokens whose ratio was clipped."),
        Family("vlrl_grad_norm", "gauge", "Gradient norm before clipping."),
        Family(
            "vlrl_rollout_logprob_diff",
            "gauge",
            "|trainer - sampler| log-prob of the step's sampled tokens (before the update).",
            ("stat",),
        ),
        Family(
            "vlrl_rollout_sampler_kl", "gauge", "k3 estimate of KL(sampler || trainer) on the step's sampled tokens."
        ),
        Family("vlrl_learning_rate", "gauge", "Learning rate after the step."),
        # evaluation
        Family("vlrl_eval_step", "gauge", "Step of the latest holdout evaluation."),
        Family("vlrl_eval_success_rate", "gauge", "Holdout success rate of the latest evaluation (greedy)."),
        Family("vlrl_eval_success_bound", "gauge", "95% Wilson interval of the holdout success rate.", ("bound",)),
        Family("vlrl_eval_episodes", "gauge", "Episodes in the latest evaluation."),
        Family("vlrl_eval_mean_turns", "gauge", "Mean turns per episode in the latest evaluation."),
        Family("vlrl_eval_invalid_rate", "gauge", "Invalid actions per turn in the latest evaluation."),
        # time
        Family(
            "vlrl_phase_seconds",
            "gauge",
            "Seconds the latest step spent in each phase (phases do not overlap).",
            ("phase",),
        ),
        Family(
            "vlrl_adapter_transport",
            "gauge",
            "1 for the way adapters reach the vLLM engines: memory, or disk files after a fallback.",
            ("transport",),
        ),
        Family("vlrl_step_seconds", "gauge", "Wall-clock seconds of the latest step."),
        Family("vlrl_rollout_seconds", "gauge", "Seconds of the latest step's rollouts (generate + env + overhead)."),
        Family(
            "vlrl_update_seconds", "gauge", "Seconds of the latest step's update (logprob + optimizer + transfers)."
        ),
        # throughput
        Family(
            "vlrl_tokens_per_second",
            "gauge",
            "Tokens per second while generating (rollout) or updating (train).",
            ("kind",),
        ),
        Family("vlrl_episodes_per_second", "gauge", "Episodes per second of rollout time."),
        Family("vlrl_completions_per_second", "gauge", "Completions (engine outputs) per second of rollout time."),
        Family("vlrl_episodes", "counter", "Episodes played."),
        Family("vlrl_completions", "counter", "Completions generated."),
        Family("vlrl_generated_tokens", "counter", "Tokens generated by the rollout engines."),
        Family("vlrl_trained_tokens", "counter", "Tokens of the sequences the policy was updated on."),
        # resources, per worker
        Family("vlrl_process_resident_memory_bytes", "gauge", "Resident memory of the process.", ("worker",)),
        Family("vlrl_host_memory_used_bytes", "gauge", "Memory in use on the worker's machine.", ("worker",)),
        Family("vlrl_host_memory_total_bytes", "gauge", "Memory of the worker's machine.", ("worker",)),
        Family(
            "vlrl_gpu_utilization_percent",
            "gauge",
            "GPU utilisation over the latest step (NVML, mean).",
            ("worker", "gpu"),
            True,
        ),
        Family(
            "vlrl_gpu_memory_used_bytes",
            "gauge",
            "GPU memory in use, peak over the latest step.",
            ("worker", "gpu"),
            True,
        ),
        Family("vlrl_gpu_memory_total_bytes", "gauge", "GPU memory of the device.", ("worker", "gpu"), True),
    ]
}

# record key (or keys: the first present wins) -> (family, its extra label values)
RECORD_METRICS: list[tuple[tuple[str, ...], str, dict[str, str]]] = [
    (("step",), "vlrl_step", {}),
    (("run/restarts",), "vlrl_restarts", {}),
    (("reward/mean",), "vlrl_reward_mean", {}),
    (("reward/std",), "vlrl_reward_std", {}),
    (("episode/success",), "vlrl_success_rate", {}),
    (("episode/turns",), "vlrl_episode_turns", {}),
    (("episode/invalid_actions",), "vlrl_episode_invalid_actions", {}),
    (("episode/wall_bumps",), "vlrl_episode_wall_bumps", {}),
    (("episode/response_tokens",), "vlrl_episode_response_tokens", {}),
    (("episode/truncated",), "vlrl_truncation_rate", {}),
    (("groups/dropped",), "vlrl_groups_dropped", {}),
    (("rollout/success_all",), "vlrl_sampled_success_rate", {}),
    (("rollout/reward_all",), "vlrl_sampled_reward_mean", {}),
    (("train/effective_episodes",), "vlrl_effective_episodes", {}),
    (("train/optimizer_steps",), "vlrl_optimizer_steps", {}),
    (("groups/rare_best",), "vlrl_groups_rare_best", {}),
    (("train/loss",), "vlrl_loss", {}),
    (("train/kl",), "vlrl_kl", {}),
    (("train/entropy",), "vlrl_entropy", {}),
    (("train/clip_fraction",), "vlrl_clip_fraction", {}),
    (("train/grad_norm",), "vlrl_grad_norm", {}),
    (("rollout/logprob_diff_mean",), "vlrl_rollout_logprob_diff", {"stat": "mean"}),
    (("rollout/logprob_diff_max",), "vlrl_rollout_logprob_diff", {"stat": "max"}),
    (("rollout/kl_sampler_trainer_k3",), "vlrl_rollout_sampler_kl", {}),
    (("train/lr",), "vlrl_learning_rate", {}),
    (("eval/success_rate",), "vlrl_eval_success_rate", {}),
    (("eval/success_low",), "vlrl_eval_success_bound", {"bound": "low"}),
    (("eval/success_high",), "vlrl_eval_success_bound", {"bound": "high"}),
    (("eval/n",), "vlrl_eval_episodes", {}),
    (("eval/mean_turns",), "vlrl_eval_mean_turns", {}),
    (("eval/invalid_rate",), "vlrl_eval_invalid_rate", {}),
    (("time/generate_s",), "vlrl_phase_seconds", {"phase": "generate"}),
    (("time/env_s",), "vlrl_phase_seconds", {"phase": "env"}),
    (("time/logprob_s",), "vlrl_phase_seconds", {"phase": "logprob"}),
    (("time/optim_s",), "vlrl_phase_seconds", {"phase": "optimizer"}),
    (("time/sync_s",), "vlrl_phase_seconds", {"phase": "sync"}),
    (("time/eval_s",), "vlrl_phase_seconds", {"phase": "eval"}),
    (("time/checkpoint_s",), "vlrl_phase_seconds", {"phase": "checkpoint"}),
    (("sync/transport_memory",), "vlrl_adapter_transport", {"transport": "memory"}),
    (("sync/transport_disk",), "vlrl_adapter_transport", {"transport": "disk"}),
    (("time/step_s",), "vlrl_step_seconds", {}),
    (("time/rollout_s",), "vlrl_rollout_seconds", {}),
    (("time/update_s",), "vlrl_update_seconds", {}),
    (("throughput/rollout_tokens_per_s",), "vlrl_tokens_per_second", {"kind": "rollout"}),
    (("throughput/train_tokens_per_s",), "vlrl_tokens_per_second", {"kind": "train"}),
    (("throughput/episodes_per_s",), "vlrl_episodes_per_second", {}),
]

# resource/<worker>/<name> (resources.py) -> family; gpu/<i>/<name> adds the label gpu=<i>
RESOURCE_METRICS: dict[str, str] = {
    "process_resident_memory_bytes": "vlrl_process_resident_memory_bytes",
    "host_memory_used_bytes": "vlrl_host_memory_used_bytes",
    "host_memory_total_bytes": "vlrl_host_memory_total_bytes",
    "utilization_percent": "vlrl_gpu_utilization_percent",
    "memory_used_bytes": "vlrl_gpu_memory_used_bytes",
    "memory_total_bytes": "vlrl_gpu_memory_total_bytes",
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class RunState:
    """The latest value of every series of one run, updated step by step (thread-safe)."""

    def __init__(
        self, run: str, info: dict[str, str] | None = None, total_steps: int | None = None, restarts: int | None = None
    ):
        self.run = run
        self.info = info or {}
        self.total_steps = total_steps
        self._lock = threading.Lock()
        # (family, sorted extra labels) -> value
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._totals: dict[str, float] = {}  # counters, from the first step that lets us count them
        self._guard_events: dict[tuple[str, str], float] = {}  # (check, action) -> events (guard/<check>/<action> keys)
        if restarts is not None:
            self._set("vlrl_restarts", float(restarts))

    def _set(self, family: str, value: float, labels: dict[str, str] | None = None) -> None:
        self._values[(family, tuple(sorted((labels or {}).items())))] = value

    def update(self, record: Mapping[str, Any]) -> None:
        """Fold one step record into the state (keys the table does not know are ignored)."""
        r = {k: v for k, v in ((k, _number(v)) for k, v in record.items()) if v is not None}
        with self._lock:
            for keys, family, labels in RECORD_METRICS:
                key = next((k for k in keys if k in r), None)
                if key is not None:
                    self._set(family, r[key], labels)
            if "eval/success_rate" in r and "step" in r:
                self._set("vlrl_eval_step", r["step"])
            turns = r.get("episode/turns")
            if turns:
                for key, family in (
                    ("episode/invalid_actions", "vlrl_invalid_action_rate"),
                    ("episode/wall_bumps", "vlrl_wall_bump_rate"),
                ):
                    if key in r:
                        self._set(family, r[key] / turns)
            self._update_counts(r)
            for key, value in r.items():
                if key.startswith("resource/"):
                    self._set_resource(key, value)
                elif key.startswith("guard/") and key.count("/") == 2:
                    check, action = key.split("/")[1:]
                    self._guard_events[(check, action)] = self._guard_events.get((check, action), 0.0) + value
            if "step" in r:
                self._set("vlrl_last_step_timestamp_seconds", time.time())

    def _update_counts(self, r: dict[str, float]) -> None:
        def product(a: str, b: str) -> float | None:
            return r[a] * r[b] if a in r and b in r else None

        episodes = r.get("rollout/episodes", product("throughput/episodes_per_s", "time/rollout_s"))
        tokens = r.get("rollout/generated_tokens", product("throughput/rollout_tokens_per_s", "time/generate_s"))
        completions = r.get("rollout/completions")
        if completions is None and episodes is not None and "episode/turns" in r:
            completions = round(episodes) * r["episode/turns"]
        trained = r.get("train/tokens", product("throughput/train_tokens_per_s", "time/update_s"))
        for family, value in (
            ("vlrl_episodes", episodes),
            ("vlrl_generated_tokens", tokens),
            ("vlrl_completions", completions),
            ("vlrl_trained_tokens", trained),
        ):
            if value is not None:
                self._totals[family] = self._totals.get(family, 0.0) + round(value)
        if completions is not None and r.get("time/rollout_s"):
            self._set("vlrl_completions_per_second", round(completions) / r["time/rollout_s"])
            if tokens is not None and completions:
                self._set("vlrl_response_tokens", tokens / round(completions))

    def _set_resource(self, key: str, value: float) -> None:
        parts = key.split("/")  # resource/<worker>/<name> or resource/<worker>/gpu/<i>/<name>
        if len(parts) == 3 and parts[2] in RESOURCE_METRICS:
            self._set(RESOURCE_METRICS[parts[2]], value, {"worker": parts[1]})
        elif len(parts) == 5 and parts[2] == "gpu" and parts[4] in RESOURCE_METRICS:
            self._set(RESOURCE_METRICS[parts[4]], value, {"worker": parts[1], "gpu": parts[3]})

    def families(self, live: Mapping[str, Any] | None = None) -> list[Metric]:
        """The metric families as prometheus_client renders them, with `live` resource keys added."""
        with self._lock:
            values = dict(self._values)
            totals = dict(self._totals)
            if self.total_steps is not None:
                values[("vlrl_total_steps", ())] = float(self.total_steps)
            if self.info:
                values[("vlrl_run_info", tuple(sorted(self.info.items())))] = 1.0
            for family, total in totals.items():
                values[(family, ())] = total
            for (check, action), count in self._guard_events.items():
                values[("vlrl_guard_events", (("action", action), ("check", check)))] = count
        if live:
            scratch = RunState(self.run)
            for key, value in live.items():
                scratch._set_resource(key, value)
            values.update(scratch._values)
        out: dict[str, Metric] = {}
        for (name, labels), value in sorted(values.items()):
            family = FAMILIES[name]
            if name not in out:
                label_names = ["run", *family.labels]
                make = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
                out[name] = make(name, family.help, labels=label_names)
            extra = dict(labels)
            out[name].add_metric([self.run, *(extra.get(label, "") for label in family.labels)], value)
        return list(out.values())


class _RunCollector(Collector):
    def __init__(self, state: RunState, live_driver: bool):
        self.state = state
        self.live_driver = live_driver

    def collect(self) -> Iterable[Metric]:
        live = {f"resource/driver/{k}": v for k, v in host_memory().items()} if self.live_driver else None
        return self.state.families(live)


def run_info(config: Any) -> dict[str, str]:
    """Labels of `vlrl_run_info` from a RunConfig."""
    return {
        "model": Path(str(config.model.path)).name,
        "env": str(config.env.name),
        "engine": str(config.rollout.engine),
        "backend": str(config.runtime.backend),
        "workers": str(config.runtime.num_workers),
    }


class MetricsExporter:
    """The run's metrics on `http://<tracking.exporter_host>:<tracking.exporter_port>/metrics`.

    `restarts`: how often this run had been restarted before this process (the trainer knows it
    from its checkpoint); a record's `run/restarts` replaces it. `port`/`host` override the
    config. With `tracking.exporter_port` None nothing is served and `publish` only keeps the
    state (`render()` still works). Port 0 takes a free port (see `.port`). A port already in use
    is a `VlrlError` naming the setting, raised here, before training starts.
    """

    def __init__(
        self,
        config: Any,
        run_name: str,
        *,
        restarts: int = 0,
        port: int | None = None,
        host: str | None = None,
        live_driver: bool = True,
    ):
        tracking = config.tracking
        self.host = host if host is not None else tracking.exporter_host
        port = port if port is not None else tracking.exporter_port
        self.state = RunState(run_name, run_info(config), config.train.steps, restarts)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_RunCollector(self.state, live_driver))
        self._server = self._thread = None
        self.port: int | None = None
        if port is None:
            return
        try:
            self._server, self._thread = start_http_server(port, addr=self.host, registry=self.registry)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise VlrlError(
                    f"tracking.exporter_port {port} on {self.host} is already in use; choose another port, "
                    "or 0 for any free one"
                ) from None
            raise VlrlError(
                f"cannot serve metrics on {self.host}:{port} (tracking.exporter_host/exporter_port): {exc}"
            ) from None
        self.port = self._server.server_port

    @property
    def url(self) -> str | None:
        """Where Prometheus scrapes (None when not serving)."""
        if self.port is None:
            return None
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}/metrics"

    def publish(self, record: Mapping[str, Any]) -> None:
        """One step's record (the metrics.jsonl line: `step` plus values); safe from any thread."""
        self.state.update(record)

    def publish_step(self, metrics: Any) -> None:
        """The trainer's `StepMetrics` (usable directly as its on_step callback)."""
        self.publish({"step": metrics.step, **metrics.values})

    def render(self) -> str:
        """The exposition text a scrape would get."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

    def close(self) -> None:
        """Stop serving (the port is free again); idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = self._thread = None

    def __enter__(self) -> MetricsExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
