"""deploy/prometheus/alerts.yml: promtool checks and unit tests, and the names the rules use.

`promtool test rules` runs alerts_test.yml, which shows every alert firing and not firing on
synthetic series. A planted change of one threshold must make it fail (the tests can fail). Every
metric an alert uses must be one vlrl exports: the training exporter's families
(`vlrl.observability.metrics.FAMILIES`) or the serving layer's (`vlrl.serve.metrics`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from vlrl.observability.metrics import FAMILIES
from vlrl.serve.metrics import ServeMetrics

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"
PROMETHEUS_RULE = ROOT / "deploy" / "k8s" / "monitoring" / "prometheusrule.yaml"
PROMTOOL = shutil.which("promtool")


def _promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess:
    if PROMTOOL is None:
        if os.geteuid() == 0 or os.environ.get("CI"):
            pytest.fail("promtool is missing: run scripts/setup-system.sh (Debian's prometheus package ships it)")
        pytest.skip("promtool (Debian's prometheus package) not installed: run scripts/setup-system.sh as root")
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_alert_rules_pass_promtool_check():
    result = _promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_alert_unit_tests_pass():
    result = _promtool("test", "rules", ALERTS_TEST.name)
    print(result.stdout + result.stderr)  # the evidence: `pytest -s` shows promtool's own report
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize(
    "alert,old,new",
    [
        ("VlrlRunStalled", "> 30 * 60", "> 60 * 60"),  # would no longer fire after 35 minutes
        ("VlrlServeErrorRate", ") > 0.05", ") > 0.5"),  # 9% errors would pass unnoticed
        ("VlrlGpuMemoryNearFull", "> 0.95", "> 0.99"),
    ],
)
def test_a_planted_threshold_change_fails_the_unit_tests(tmp_path, alert, old, new):
    text = ALERTS.read_text()
    start = text.index(f"alert: {alert}")
    end = text.find("- alert:", start + 1)
    end = len(text) if end < 0 else end
    assert old in text[start:end], (alert, old)
    (tmp_path / "alerts.yml").write_text(text[:start] + text[start:end].replace(old, new, 1) + text[end:])
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    result = _promtool("test", "rules", ALERTS_TEST.name, cwd=tmp_path)
    report = result.stdout + result.stderr
    assert result.returncode != 0 and f"alertname: {alert}" in report, report


def test_every_alert_is_tested_firing_and_not_firing():
    tests = [t for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"] for t in case.get("alert_rule_test", [])]
    for rule in rules():
        mine = [t for t in tests if t["alertname"] == rule["alert"]]
        assert any(t.get("exp_alerts") for t in mine), f"{rule['alert']}: no test where it fires"
        assert any(not t.get("exp_alerts") for t in mine), f"{rule['alert']}: no test where it stays quiet"


def exported_names() -> set[str]:
    """Every series name vlrl exposes: training families (counters with _total) and the serving layer's."""
    names = {family.exposed for family in FAMILIES.values()}
    serving = ServeMetrics(lambda: {"maze": "maze:v1"})
    serving.observe("maze", 200, 0.1)
    for family in text_string_to_metric_families(serving.render().decode()):
        names |= {sample.name for sample in family.samples}
    return names


def test_every_metric_an_alert_uses_is_exported():
    exported = exported_names()
    assert {
        "vlrl_serve_requests_total",
        "vlrl_serve_request_seconds_bucket",
        "vlrl_restarts_total",
        "vlrl_guard_events_total",
    } <= exported
    for rule in rules():
        for name in set(re.findall(r"\b(vlrl_[a-z0-9_]+)", rule["expr"])):
            assert name in exported, f"{rule['alert']} uses {name}, which vlrl does not export"


def test_every_alert_names_severity_summary_and_an_existing_runbook():
    for rule in rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert (ROOT / rule["annotations"]["runbook"]).is_file(), (
            f"{rule['alert']}: {rule['annotations']['runbook']} does not exist"
        )


def test_prometheus_configs_load_the_rules():
    workstation = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert [PROMETHEUS_DIR / f for f in workstation["rule_files"]] == [ALERTS]
    in_cluster = yaml.safe_load((PROMETHEUS_DIR / "prometheus-kubernetes.yml").read_text())
    assert in_cluster["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    operator = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert operator["kind"] == "PrometheusRule"
    assert operator["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"], (
        "deploy/k8s/monitoring/prometheusrule.yaml differs from alerts.yml: copy alerts.yml's groups into it"
    )
