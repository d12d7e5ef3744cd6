"""docs/cluster.md and the commands the manifests run, checked against the code and the manifests.

Every `vlrl ...` command in the docs' shell blocks, their inline code and the manifests is parsed by
the real CLI (`vlrl.cli.app`): a command or option the CLI does not have fails its check. The docs'
paths, label selectors, Secret and Service names must match the repository.
"""

from __future__ import annotations

import re
import shlex

import pytest
import yaml
from deploy_helpers import (
    CRD_DIR,
    K8S,
    ROOT,
    fenced_blocks,
    inline_vlrl_commands,
    load_yaml_docs,
    manifests,
    only,
    parse_cli,
    vlrl_commands_in_shell,
)

CLUSTER_DOC = ROOT / "docs" / "cluster.md"
DOCS = [CLUSTER_DOC, K8S / "README.md"]


def documented_commands() -> list[tuple[str, list[str], bool]]:
    """(where, argv, is a whole command line) of every vlrl command in the docs and manifests."""
    found = [
        ("rayjob.yaml", shlex.split(only("RayJob")["spec"]["entrypoint"]), True),
        ("serve/deployment.yaml", only("Deployment")["spec"]["template"]["spec"]["containers"][0]["command"], True),
    ]
    for doc in DOCS:
        text = doc.read_text()
        for block in fenced_blocks(text):
            found += [(doc.name, argv, True) for argv in vlrl_commands_in_shell(block)]
        # Inline spans may name a command in prose (`vlrl submit`) rather than give a whole line.
        found += [(doc.name, argv, False) for argv in inline_vlrl_commands(text)]
    unique = {}
    for where, argv, whole in found:
        unique.setdefault((" ".join(argv), whole), (where, argv, whole))
    return list(unique.values())


def _params():
    return [pytest.param(argv, whole, id=f"{where}: {' '.join(argv)}") for where, argv, whole in documented_commands()]


def test_docs_and_manifests_contain_vlrl_commands():
    commands = [" ".join(argv) for _, argv, _ in documented_commands()]
    assert any(c.startswith("vlrl train /fsx/vlrl/configs/") for c in commands)
    assert any(c.startswith("vlrl submit ") for c in commands)
    assert any(c.startswith("vlrl serve ") for c in commands)


@pytest.mark.parametrize("argv,whole", _params())
def test_documented_command_is_registered(argv, whole):
    problems, _ = parse_cli(argv)
    if not whole:  # prose names a command or an option; its arguments may be left out
        problems = [p for p in problems if not re.search(r"Missing argument|Missing option|needs a subcommand", p)]
    assert not problems, problems


def test_referenced_repository_paths_exist():
    for doc in DOCS:
        text = doc.read_text()
        for path in set(re.findall(r"(?<![\w/.])((?:deploy|configs|docs)/[\w./-]*[\w/])", text)):
            assert (ROOT / path).exists(), f"{doc.name} refers to {path}, which does not exist"
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if not re.match(r"[a-z]+://", target):
                assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


def test_label_selectors_in_docs_select_kustomized_objects():
    kustomization = load_yaml_docs(K8S / "kustomization.yaml")[0]
    components = {
        doc["metadata"]["labels"]["app.kubernetes.io/component"]
        for resource in kustomization["resources"]
        for doc in load_yaml_docs(K8S / resource)
    }
    selectors = re.findall(r"-l app\.kubernetes\.io/component=([\w-]+)", CLUSTER_DOC.read_text())
    assert {"ray-cluster", "training"} <= set(selectors)
    for selector in selectors:
        assert selector in components, f"`-l app.kubernetes.io/component={selector}` selects nothing"


def test_secret_creation_matches_the_manifests():
    secret = only("Secret")
    name, (key,) = secret["metadata"]["name"], secret["stringData"].keys()
    assert only("RayCluster")["spec"]["authOptions"]["secretName"] == name
    text = CLUSTER_DOC.read_text()
    assert f"create secret generic {name} --from-literal={key}=" in text
    assert f"get secret {name} -o jsonpath='{{.data.{key}}}'" in text


def test_names_used_in_docs_match_the_objects():
    text = CLUSTER_DOC.read_text()
    cluster = only("RayCluster")["metadata"]["name"]
    job = only("RayJob")["metadata"]["name"]
    assert f"port-forward svc/{cluster}-head-svc 8265:8265" in text, "KubeRay names the head Service <cluster>-head-svc"
    assert f"raycluster/{cluster}" in text and f"rayjob {job}" in text and f"job/{job}" in text
    worker_groups = {g["groupName"] for g in only("RayCluster")["spec"]["workerGroupSpecs"]}
    for group in re.findall(r"ray\.io/group=([\w-]+)", text):
        assert group in worker_groups
    assert f"svc/{only('Service')['metadata']['name']} 8000:8000" in text
    assert "podMonitor/vlrl/" + only("PodMonitor")["metadata"]["name"] in text


def test_docs_show_the_rayjob_entrypoint_verbatim():
    assert only("RayJob")["spec"]["entrypoint"] in CLUSTER_DOC.read_text()


def test_operator_version_in_docs_is_the_one_the_crds_come_from():
    readme = CRD_DIR / "README.md"
    if not readme.is_file():
        pytest.skip(f"{readme} not found (shared/ must sit beside the repository)")
    (version,) = set(re.findall(r"KubeRay v(\d+\.\d+\.\d+)", readme.read_text()))
    assert f"kuberay/kuberay-operator --version {version}" in CLUSTER_DOC.read_text()


def test_yaml_snippets_in_docs_parse():
    for block in fenced_blocks(CLUSTER_DOC.read_text(), languages=("yaml",)):
        assert yaml.safe_load(block) is not None


def test_docs_say_what_was_and_was_not_validated():
    text = CLUSTER_DOC.read_text()
    assert "## What was validated, and what was not" in text
    assert "**Not validated**" in text


def test_every_manifest_is_mentioned_in_the_k8s_readme():
    readme = (K8S / "README.md").read_text()
    for path in {p for p, _ in manifests()} | set(K8S.rglob("kustomization.yaml")):
        relative = path.relative_to(K8S)
        assert str(relative) in readme or f"{relative.parent}/" in readme, f"README.md does not list {relative}"
