"""The dashboard, the scrape configs and the metric reference, checked without a Prometheus.

(tests/observability/test_dashboard_prometheus.py evaluates every query against a real one.)
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml
from dashboard_helpers import (
    METRIC,
    PROMETHEUS_K8S_YML,
    PROMETHEUS_YML,
    ROOT,
    dashboard,
    is_gpu_only,
    panels,
    scrape_config_for,
)

from vlrl.observability.metrics import FAMILIES

EXPOSED = {f.exposed: f for f in FAMILIES.values()}
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def test_dashboard_is_an_importable_grafana_model():
    board = dashboard()
    assert board["schemaVersion"] >= 39 and board["uid"] == "vlrl-training" and board["id"] is None
    assert board["__inputs"] == [
        {**board["__inputs"][0], "name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}
    ]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    # The datasource variable has the input's name, so ${DS_PROMETHEUS} also resolves when the JSON
    # is provisioned from a file (where Grafana ignores __inputs).
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    run = variables["run"]
    assert run["type"] == "query" and run["definition"] == run["query"] == "label_values(vlrl_step, run)"
    assert run["datasource"] == DS and not run["multi"] and not run["includeAll"]
    ids = [p["id"] for p in board["panels"]] + [c["id"] for p in board["panels"] for c in p.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids are unique"


def test_panels_have_datasource_queries_and_a_non_overlapping_layout():
    board = dashboard()
    ids = set()
    cells: dict[tuple[int, int], str] = {}
    for panel in board["panels"]:
        assert panel["id"] not in ids, panel["title"]
        ids.add(panel["id"])
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["description"], panel
        assert panel["datasource"] == DS, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DS and target["expr"].strip(), panel["title"]
            assert 'run="$run"' in target["expr"], f"{panel['title']}: every query selects the run"


def test_rows_cover_the_issue():
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert {"Learning", "Throughput", "Where time goes", "Resources", "Restarts"} <= set(rows)
    titles = " ".join(p["title"].lower() for p in panels())
    for word in (
        "reward",
        "success",
        "kl",
        "entropy",
        "tokens per second",
        "completions",
        "phase",
        "gpu utilisation",
        "gpu memory",
        "host memory",
        "restarts",
    ):
        assert word in titles, word


def test_every_query_uses_exported_metrics_and_gpu_panels_are_marked():
    for panel in panels():
        names = {m for t in panel["targets"] for m in METRIC.findall(t["expr"])}
        unknown = names - EXPOSED.keys()
        assert not unknown, f"{panel['title']}: {unknown} are not exported (vlrl.observability.metrics.FAMILIES)"
        gpu = {n for n in names if EXPOSED[n].gpu_only}
        if is_gpu_only(panel):
            assert gpu == names, f"{panel['title']} is marked GPU only but queries {names - gpu}"
        else:
            assert not gpu, f"{panel['title']} queries GPU-only {gpu}: mark it 'GPU only: ...' or split it"


def test_metric_reference_in_docs_lists_exactly_the_exported_families():
    text = (ROOT / "docs" / "observability.md").read_text()
    documented = set(re.findall(r"^\| `(vlrl_[a-z_]+)`", text, flags=re.M))
    assert documented == set(EXPOSED), (
        f"missing in docs: {set(EXPOSED) - documented}",
        f"not exported: {documented - set(EXPOSED)}",
    )
    for name, family in EXPOSED.items():
        row = re.search(rf"^\| `{name}` \|([^\n]*)$", text, flags=re.M).group(1)
        assert family.kind in row, f"{name}: the table gives its type"
        assert ("GPU only" in row) == family.gpu_only, f"{name}: GPU-only metrics say so"


PROMTOOL = shutil.which("promtool")


def _promtool_check(path) -> None:
    result = subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian's prometheus package) not installed: run scripts/setup-system.sh as root"
)
def test_scrape_configs_pass_promtool(tmp_path):
    # promtool insists that the serving job's token file exists; Prometheus itself starts without it
    # (that target is down until the file is there). Check a copy with a token file in place.
    workstation = yaml.safe_load(PROMETHEUS_YML.read_text())
    token = tmp_path / "serve.token"
    token.write_text("t\n")
    (serve,) = [job for job in workstation["scrape_configs"] if job["job_name"] == "vlrl-serve"]
    serve["authorization"]["credentials_file"] = str(token)
    workstation["rule_files"] = [str(PROMETHEUS_YML.parent / f) for f in workstation["rule_files"]]
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(workstation))
    _promtool_check(copy)
    generated = tmp_path / "test.yml"
    generated.write_text(yaml.safe_dump(scrape_config_for(12345)))
    _promtool_check(generated)
    # Debian builds Prometheus without Kubernetes discovery; check everything else of the
    # in-cluster config (the relabelling above all) with static targets in its place.
    k8s = yaml.safe_load(PROMETHEUS_K8S_YML.read_text())
    k8s["rule_files"] = [str(PROMETHEUS_YML.parent / "alerts.yml")]  # mounted from a ConfigMap in the cluster
    for job in k8s["scrape_configs"]:
        sd = job.pop("kubernetes_sd_configs")
        assert [c["role"] for c in sd] == ["pod"] and sd[0]["namespaces"]["names"] == ["vlrl"]
        job["static_configs"] = [{"targets": ["10.0.0.1:8080"]}]
    flattened = tmp_path / "k8s.yml"
    flattened.write_text(yaml.safe_dump(k8s))
    _promtool_check(flattened)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def test_operator_objects_match_the_plain_configs():
    plain = {j["job_name"]: j for j in yaml.safe_load(PROMETHEUS_K8S_YML.read_text())["scrape_configs"]}
    scrape = yaml.safe_load((ROOT / "deploy" / "k8s" / "monitoring" / "scrapeconfig.yaml").read_text())
    assert scrape["kind"] == "ScrapeConfig" and scrape["apiVersion"] == "monitoring.coreos.com/v1alpha1"
    vlrl = plain["vlrl"]
    sd = scrape["spec"]["kubernetesSDConfigs"][0]
    assert sd["role"] == "Pod" and sd["namespaces"]["names"] == vlrl["kubernetes_sd_configs"][0]["namespaces"]["names"]
    assert sd["selectors"][0]["label"] == vlrl["kubernetes_sd_configs"][0]["selectors"][0]["label"]
    relabel = [{_camel(k): v for k, v in r.items()} for r in vlrl["relabel_configs"]]
    assert scrape["spec"]["relabelings"] == relabel
    # the exporter's port agrees everywhere: static example, in-cluster config, operator object
    (target,) = yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"][0]["static_configs"][0]["targets"]
    port = target.rsplit(":", 1)[1]
    assert any(r.get("replacement") == f"$1:{port}" for r in scrape["spec"]["relabelings"])
    monitor = yaml.safe_load((ROOT / "deploy" / "k8s" / "monitoring" / "podmonitor.yaml").read_text())
    assert (
        monitor["spec"]["selector"]["matchLabels"]["ray.io/cluster"] == "vlrl"
        and "ray.io/cluster=vlrl" in sd["selectors"][0]["label"]
    )


def test_commands_in_the_docs_parse():
    import shlex

    from typer.testing import CliRunner

    from vlrl.cli import app
    from vlrl.config import load_config

    text = (ROOT / "docs" / "observability.md").read_text()
    blocks = [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M) if lang == "bash"]
    commands = [
        shlex.split(line.split("#")[0]) for block in blocks for line in block.splitlines() if line.startswith("vlrl ")
    ]
    commands.append(
        shlex.split(re.search(r"`(vlrl train configs/ci-tiny.yaml[^`]*)`", text.replace("\n", " ")).group(1))
    )
    assert {c[1] for c in commands} == {"train", "report"}
    for argv in commands:
        if argv[1] == "train":  # the config and every override must load
            load_config(ROOT / argv[2], [a for a in argv[3:] if not a.startswith("--")])
        result = CliRunner().invoke(app, [argv[1], "--help"])
        assert result.exit_code == 0 and all(o in result.output for o in argv[2:] if o.startswith("--")), argv
