"""Every query of every Grafana panel, evaluated by a real Prometheus after a real training run.

Prometheus (Debian's package) runs on 127.0.0.1 with deploy/prometheus/prometheus.yml, its `vlrl`
job pointed at the test's exporter and scraping every second. The tiny model trains 2 GRPO steps
in process (runtime.backend=local) and each step's record goes to the exporter as the trainer
will send it: the record itself, the update's timings (`UpdateStats.timings` as `time/*`) and the
worker's resources (`ResourceMonitor`). Then each panel query, with `$run` and Grafana's interval
macros filled in, goes to Prometheus's HTTP API over the whole run; a query that returns no data
fails the test, and all such queries are listed. Panels marked "GPU only" are skipped exactly when
this machine has no GPU, and named.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import torch
import yaml
from dashboard_helpers import dashboard, is_gpu_only, panels, scrape_config_for, substitute

from vlrl.observability import resources
from vlrl.observability.metrics import MetricsExporter
from vlrl.training.trainer import GRPOTrainer

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="Debian's `prometheus` is not installed: run scripts/setup-system.sh as root (make system)",
    ),
]
RUN = "dash-test"
STEPS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusAPI:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def series(self, expr: str, start: float, end: float, instant: bool = False) -> list[dict]:
        """The result of a panel query: a range query over the run (or an instant one at its end)."""
        if instant:
            return self.get("/api/v1/query", query=expr, time=end)["result"]
        return self.get("/api/v1/query_range", query=expr, start=start, end=end, step="1s")["result"]


@pytest.fixture
def exporter(ci_config):
    with MetricsExporter(ci_config(f"train.steps={STEPS}"), RUN, port=0, host="127.0.0.1") as exp:
        yield exp


@pytest.fixture
def prometheus(exporter, tmp_path):
    """Prometheus scraping the exporter every second; stopped (its whole process group) afterwards."""
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config_for(exporter.port)))
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    api = PrometheusAPI(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited ({proc.returncode}):\n{(tmp_path / 'prometheus.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{api.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus did not become ready in 60 s"
            time.sleep(0.2)
        yield api
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        log.close()


def _train_and_publish(cfg, run_dir, exporter) -> list[dict]:
    """Real GRPO steps; each step's record, timings and resources go to the exporter."""
    trainer = GRPOTrainer(cfg, run_dir)
    trainer.setup()
    monitor = resources.ResourceMonitor(0)  # the in-process worker is rank 0
    timings: dict[str, float] = {}
    update = trainer.worker.update

    def update_keeping_timings(*args, **kwargs):
        stats = update(*args, **kwargs)
        timings.clear()
        timings.update(stats.timings)
        return stats

    trainer.worker.update = update_keeping_timings
    published = []

    def on_step(m) -> None:
        record = {"step": m.step, **m.values, **{f"time/{k}": v for k, v in timings.items()}, **monitor.snapshot()}
        exporter.publish(record)
        published.append(record)

    trainer.on_step = on_step
    try:
        for _ in range(STEPS):
            trainer.step()
    finally:
        monitor.close()
        trainer.close()
    return published


def test_every_dashboard_query_returns_data(ci_config, exporter, prometheus, tmp_path):
    # kl_coef > 0: the reference log-probs and the KL exist (a run without a KL term leaves that panel
    # empty). One holdout evaluation (after step 1) on 4 tasks; 3 turns an episode keep it short.
    # On a GPU machine the policy trains on the GPU, and the GPU panels must show it.
    gpu = ["runtime.use_gpu=true"] if torch.cuda.is_available() else []
    cfg = ci_config(
        f"train.steps={STEPS}",
        "train.eval_every=1",
        "train.eval_tasks=4",
        "env.max_turns=3",
        "algo.kl_coef=0.01",
        f"storage.run_name={RUN}",
        *gpu,
    )
    start = time.time() - 2
    published = _train_and_publish(cfg, tmp_path / RUN, exporter)
    assert published[-1]["time/logprob_s"] > 0 and published[-1]["time/optim_s"] > 0  # the update's real timings

    # Wait until Prometheus holds the last step, then two more scrapes for the rate windows.
    deadline = time.monotonic() + 30
    while not any(
        float(s["value"][1]) == STEPS
        for s in prometheus.series(f'vlrl_step{{run="{RUN}"}}', 0, time.time(), instant=True)
    ):
        assert time.monotonic() < deadline, "Prometheus never scraped the last step"
        time.sleep(0.5)
    time.sleep(2.5)
    end = time.time()
    range_s = int(end - start) + 1

    assert RUN in prometheus.get("/api/v1/label/run/values", **{"match[]": "vlrl_step"})  # the `run` variable's query
    phases = {s["metric"]["phase"] for s in prometheus.series(f'vlrl_phase_seconds{{run="{RUN}"}}', start, end)}
    assert {"generate", "env", "logprob", "optimizer", "sync"} <= phases, phases

    on_gpu = bool(resources.gpu_readings())
    checked, skipped, empty = [], [], []
    for panel in panels(dashboard()):
        if is_gpu_only(panel) and not on_gpu:
            skipped.append(panel["title"])
            continue
        counts = []
        for target in panel["targets"]:
            expr = substitute(target["expr"], RUN, range_s)
            result = prometheus.series(expr, start, end, instant=target.get("instant", False))
            points = sum(len(s.get("values", [])) or 1 for s in result)
            counts.append(f"{len(result)} series/{points} pts")
            if not result:
                empty.append(f"{panel['title']}: {expr}")
        checked.append(f"{panel['title']}: {', '.join(counts)}")
    print(
        f"\nPrometheus evaluated {sum(len(p['targets']) for p in panels() if p['title'] not in skipped)} queries "
        f"of {len(checked)} panels over {range_s} s:"
    )
    print("\n".join(f"  ok   {line}" for line in checked if line.split(":")[0] not in {e.split(":")[0] for e in empty}))
    print("\n".join(f"  GPU only, skipped on this CPU machine: {title}" for title in skipped))
    assert not empty, "queries that returned nothing:\n" + "\n".join(empty)
    assert on_gpu or len(skipped) == sum(is_gpu_only(p) for p in panels())

    # The alert rules load into the real Prometheus with the config, evaluate without error on the
    # run's live series, and none fires for this healthy, finished run.
    rules = prometheus.get("/api/v1/rules")["groups"]
    loaded = {rule["name"]: rule for group in rules for rule in group["rules"]}
    assert {"VlrlRunStalled", "VlrlRunRestarted", "VlrlGpuMemoryNearFull", "VlrlServeErrorRate"} <= set(loaded)
    assert all(rule["health"] == "ok" for rule in loaded.values()), {n: r.get("lastError") for n, r in loaded.items()}
    assert all(rule["state"] == "inactive" for rule in loaded.values()), {n: r["state"] for n, r in loaded.items()}
