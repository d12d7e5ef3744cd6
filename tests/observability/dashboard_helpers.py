"""The Grafana dashboard and scrape configs as the tests read them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "vlrl-dashboard.json"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PROMETHEUS_K8S_YML = ROOT / "deploy" / "prometheus" / "prometheus-kubernetes.yml"
GPU_ONLY = "GPU only"  # a panel whose description starts with this shows GPU metrics alone
METRIC = re.compile(r"\bvlrl_[a-z_]+\b")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict | None = None) -> list[dict]:
    """Every non-row panel, rows' collapsed children included."""
    out = []
    for panel in (board or dashboard())["panels"]:
        if panel["type"] == "row":
            out += panel.get("panels", [])
        else:
            out.append(panel)
    return out


def is_gpu_only(panel: dict) -> bool:
    return panel.get("description", "").startswith(GPU_ONLY)


def substitute(expr: str, run: str, range_s: int, rate_interval: str = "10s", interval: str = "1s") -> str:
    """A panel query as Grafana would send it: template variables and Grafana's interval macros filled in."""
    for name, value in (
        ("__rate_interval", rate_interval),
        ("__interval", interval),
        ("__range", f"{range_s}s"),
        ("run", run),
    ):
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def scrape_config_for(exporter_port: int, interval: str = "1s") -> dict:
    """deploy/prometheus/prometheus.yml pointed at a test's exporter, scraping every `interval`.

    Only the `vlrl` job is kept: the `ray` job reads Ray's service-discovery file, and no Ray
    runs in this test (its metrics are Ray's, not the dashboard's).
    """
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    config["global"].update(scrape_interval=interval, evaluation_interval=interval)
    # rule files are relative to the config's folder; the test's copy lives elsewhere
    config["rule_files"] = [str(PROMETHEUS_YML.parent / f) for f in config.get("rule_files", [])]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "vlrl"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{exporter_port}"]}]
    config["scrape_configs"] = [job]
    return config
