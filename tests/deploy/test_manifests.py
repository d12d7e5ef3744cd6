"""The Kubernetes manifests under deploy/k8s, checked without a cluster.

1. Every RayCluster / RayJob validates against KubeRay v1.7's CRD schema made strict (unknown
   fields rejected), and planted typos fail, which proves the strictness.
2. KubeRay's own admission rules that a schema cannot express (validation.go), and the pod-level
   rules of the API server and kubelet: ports, GPU requests = limits, mounts of declared volumes,
   Secret references that exist.
3. The manifests agree with the project: the RayJob runs a registered `vlrl train` on a config of
   configs/, the cluster has the GPUs, CPUs, mounts and metrics port that config asks for, and the
   images are the one kustomize sets.
"""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import PurePosixPath

import pytest
import yaml
from deploy_helpers import (
    K8S,
    ROOT,
    crd_schema,
    env_of,
    load_yaml_docs,
    manifest_files,
    manifests,
    objects_of_kind,
    only,
    parse_cli,
    pod_spec_schema,
    pod_specs,
    quantity,
    ray_containers,
    schema_errors,
    strict_crd_schema,
)

GPU = "nvidia.com/gpu"
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def ray_objects() -> list[tuple[str, dict]]:
    kinds = ("RayCluster", "RayJob")
    return [(f"{path.relative_to(K8S)}:{doc['kind']}", doc) for path, doc in manifests() if doc["kind"] in kinds]


def secret_example() -> dict:
    return only("Secret")


def rayjob_argv() -> list[str]:
    return shlex.split(only("RayJob")["spec"]["entrypoint"])


def job_config():
    """The RunConfig the RayJob runs: configs/<basename of its path> with its overrides."""
    from vlrl.config import load_config

    problems, params = parse_cli(rayjob_argv())
    assert not problems, problems
    return load_config(ROOT / "configs" / params["config"].name, list(params["overrides"] or []))


def mount_root(path: str, mounts: list[dict]) -> str | None:
    """The mountPath of `mounts` that contains `path`, if any."""
    for mount in mounts:
        if PurePosixPath(path).is_relative_to(mount["mountPath"]):
            return mount["mountPath"]
    return None


# -- 1. CRD schemas, strict ------------------------------------------------------------------------


def test_every_yaml_file_parses_and_names_its_kind():
    assert manifest_files(), "no manifests under deploy/k8s"
    for path, doc in manifests():
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), f"{path}: not a Kubernetes object"
        # The CRDs leave top-level metadata free-form; a typo there (`namespac`) would pass them.
        assert doc["metadata"].keys() <= {"name", "namespace", "labels", "annotations"}, f"{path}: {doc['metadata']}"
        assert DNS1035.fullmatch(doc["metadata"]["name"]), (path, doc["metadata"]["name"])
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "vlrl", path
        assert doc["metadata"]["labels"]["app.kubernetes.io/component"], f"{path}: docs select parts by component"
        if doc["kind"] not in ("Namespace", "StorageClass"):
            assert doc["metadata"]["namespace"] == "vlrl", f"{path}: {doc['kind']} outside namespace vlrl"


@pytest.mark.parametrize("where,obj", ray_objects(), ids=[w for w, _ in ray_objects()])
def test_ray_objects_validate_against_strict_crd_schema(where, obj):
    assert obj["apiVersion"] == "ray.io/v1"
    errors = schema_errors(obj, strict_crd_schema(obj["kind"]))
    assert not errors, f"{where}:\n" + "\n".join(errors)


def _rename(mapping: dict, old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


def _at(obj, path: tuple) -> dict:
    for key in path:
        obj = obj[key]
    return obj


# (kind, where the key is, the right key, the typo)
PLANTED_TYPOS = [
    ("RayCluster", ("spec", "headGroupSpec"), "rayStartParams", "rayStartParam"),
    ("RayCluster", ("spec", "workerGroupSpecs", 0), "replicas", "replica"),
    ("RayCluster", ("spec", "headGroupSpec", "template", "spec", "containers", 0), "volumeMounts", "volumeMount"),
    ("RayCluster", ("spec", "workerGroupSpecs", 0, "template", "spec", "tolerations", 0), "effect", "effects"),
    ("RayCluster", ("spec",), "authOptions", "authOption"),
    ("RayJob", ("spec",), "shutdownAfterJobFinishes", "shutdownAfterJobFinish"),
    ("RayJob", ("spec",), "entrypoint", "entryPoint"),
    ("RayJob", ("spec", "submitterPodTemplate", "spec", "containers", 0), "env", "envs"),
]


@pytest.mark.parametrize("kind,path,right,typo", PLANTED_TYPOS, ids=[t[-1] for t in PLANTED_TYPOS])
def test_a_planted_typo_fails_strict_validation(kind, path, right, typo):
    broken = copy.deepcopy(only(kind))
    _rename(_at(broken, path), right, typo)
    errors = schema_errors(broken, strict_crd_schema(kind))
    assert any(f"'{typo}' was unexpected" in e for e in errors), f"strict schema accepted {typo}: {errors}"


def test_the_plain_crd_schema_would_accept_a_typo():
    # Why strict() exists: the CRD as shipped lets a misspelt field through (the API server would
    # silently prune it, and the worker group would run with the default of 0 replicas).
    broken = copy.deepcopy(only("RayCluster"))
    _rename(broken["spec"]["workerGroupSpecs"][0], "replicas", "replica")
    assert not schema_errors(broken, crd_schema("RayCluster"))


@pytest.mark.parametrize(
    "path,value",
    [
        (("spec", "headGroupSpec", "rayStartParams", "num-gpus"), 0),  # must be a string
        (("spec", "headGroupSpec", "template", "spec", "containers", 0, "ports", 0, "containerPort"), "6379"),
        (("spec", "authOptions", "mode"), "tokens"),  # not in the enum
    ],
    ids=["int-rayStartParam", "string-port", "bad-auth-mode"],
)
def test_wrong_types_fail_validation(path, value):
    broken = copy.deepcopy(only("RayCluster"))
    _at(broken, path[:-1])[path[-1]] = value
    assert schema_errors(broken, strict_crd_schema("RayCluster"))


# -- 2. KubeRay's rules and pod sanity -------------------------------------------------------------


def all_pods() -> list[tuple[str, dict]]:
    return [(f"{path.relative_to(K8S)} {where}", pod) for path, doc in manifests() for where, pod in pod_specs(doc)]


@pytest.mark.parametrize("where,pod", all_pods(), ids=[w for w, _ in all_pods()])
def test_every_pod_spec_validates_against_the_kubernetes_pod_schema(where, pod):
    # The RayCluster CRD embeds the full core/v1 PodSpec schema; it checks the pods of plain
    # Deployments and Pods (serving, the FSx loader) as strictly as the Ray pods.
    errors = schema_errors(pod, pod_spec_schema())
    assert not errors, f"{where}:\n" + "\n".join(errors)


@pytest.mark.parametrize("where,pod", all_pods(), ids=[w for w, _ in all_pods()])
def test_pod_spec_is_sane(where, pod):
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    assert len(volumes) == len(pod.get("volumes", [])), f"{where}: duplicate volume names"
    secret = secret_example()
    claims = {doc["metadata"]["name"] for _, doc in objects_of_kind("PersistentVolumeClaim")}
    for volume in volumes.values():
        if "persistentVolumeClaim" in volume:
            assert volume["persistentVolumeClaim"]["claimName"] in claims, f"{where}: unknown claim"
    for container in pod["containers"] + pod.get("initContainers", []):
        name = f"{where} / {container['name']}"
        image = container["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"{name}: pin the image tag ({image})"
        ports = container.get("ports", [])
        for port in ports:
            assert isinstance(port["containerPort"], int) and 0 < port["containerPort"] < 65536, f"{name}: {port}"
            assert len(port.get("name", "")) <= 15, f"{name}: port names are at most 15 characters"
        assert len({p["containerPort"] for p in ports}) == len(ports), f"{name}: a port is declared twice"
        assert len({p.get("name") for p in ports}) == len(ports), f"{name}: a port name is used twice"
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{name}: mounts undeclared volume {mount['name']}"
        resources = container.get("resources", {})
        requests, limits = resources.get("requests", {}), resources.get("limits", {})
        assert limits, f"{name}: set resource limits"
        if GPU in requests or GPU in limits:
            assert requests.get(GPU) == limits.get(GPU), f"{name}: GPU requests must equal limits"
            assert any(t.get("key") == GPU for t in pod.get("tolerations", [])), f"{name}: tolerate the GPU taint"
        for resource, amount in requests.items():
            if resource in limits:
                assert quantity(amount) <= quantity(limits[resource]), f"{name}: {resource} request above limit"
        for entry in container.get("env", []):
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == secret["metadata"]["name"], f"{name}: unknown Secret {ref['name']}"
                assert ref["key"] in secret["stringData"], f"{name}: the Secret has no key {ref['key']}"


def test_ray_pods_run_as_the_image_user():
    # The Dockerfile's USER is uid 1000; files the runs write on /fsx must belong to it.
    for path, doc in manifests():
        for where, pod in pod_specs(doc):
            if any(c["image"].split(":")[0] == "vlrl" for c in pod["containers"]):
                context = pod.get("securityContext", {})
                assert context.get("runAsUser") == 1000 and context.get("runAsNonRoot") is True, f"{path} {where}"


def test_raycluster_follows_kuberay_rules():
    cluster = only("RayCluster")
    spec = cluster["spec"]
    assert len(cluster["metadata"]["name"]) <= 47, "KubeRay caps RayCluster names"
    assert spec["rayVersion"] == _pyproject_ray_pin(), "rayVersion must be the image's Ray"
    if spec.get("authOptions", {}).get("mode") == "token":
        assert tuple(int(x) for x in spec["rayVersion"].split(".")) >= (2, 52, 0), "token auth needs Ray >= 2.52"
    for where, _container, group in ray_containers(spec):
        params = group["rayStartParams"]
        assert all(isinstance(v, str) for v in params.values()), f"{where}: rayStartParams are strings"
        assert "labels" not in params, f"{where}: KubeRay rejects rayStartParams['labels']"
        if group.get("resources"):
            assert not {"num-cpus", "num-gpus", "memory", "resources"} & params.keys(), (
                f"{where}: KubeRay rejects resources in both rayStartParams and the group's resources"
            )
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]


def test_ray_start_params_are_options_of_ray_start():
    # KubeRay turns each rayStartParams entry into `ray start --key=value`; the CRD allows any key,
    # so ask Ray 2.60's own `ray start` which flags exist.
    scripts = pytest.importorskip("ray.scripts.scripts")
    options = {o for param in scripts.start.params for o in param.opts}
    for where, _, group in ray_containers(only("RayCluster")["spec"]):
        for key in group["rayStartParams"]:
            assert f"--{key}" in options, f"{where}: `ray start` has no --{key}"


def test_head_is_cpu_only_with_dashboard_and_metrics():
    spec = only("RayCluster")["spec"]
    head = spec["headGroupSpec"]
    container = head["template"]["spec"]["containers"][0]
    assert head["rayStartParams"]["num-gpus"] == "0", "no training worker may land on the head"
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert GPU not in container["resources"].get("limits", {})
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["dashboard"] == 8265 and ports["gcs-server"] == 6379 and ports["client"] == 10001


def test_every_ray_node_uses_the_same_token_auth_and_runs_offline():
    spec = only("RayCluster")["spec"]
    secret = secret_example()
    assert spec["authOptions"] == {"mode": "token", "secretName": secret["metadata"]["name"]}
    # KubeRay reads this key from authOptions.secretName for its own dashboard calls.
    assert "auth_token" in secret["stringData"]
    assert "REPLACE" in secret["stringData"]["auth_token"], "the example must not carry a real token"
    job_submitter = only("RayJob")["spec"]["submitterPodTemplate"]["spec"]["containers"][0]
    nodes = [(where, c) for where, c, _ in ray_containers(spec)] + [("submitter", job_submitter)]
    for where, container in nodes:
        env = env_of(container)
        assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", f"{where}: RAY_AUTH_MODE=token missing"
        ref = env.get("RAY_AUTH_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
        assert ref == {"name": secret["metadata"]["name"], "key": "auth_token"}, f"{where}: RAY_AUTH_TOKEN"
    for where, container, _ in ray_containers(spec):
        assert env_of(container).get("HF_HUB_OFFLINE", {}).get("value") == "1", f"{where}: HF_HUB_OFFLINE=1"


def test_ray_nodes_mount_fsx_and_a_memory_backed_shm():
    spec = only("RayCluster")["spec"]
    claim = only("PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["spec"]["storageClassName"] == "fsx-sc"
    assert only("StorageClass")["provisioner"] == "fsx.csi.aws.com"
    for where, container, group in ray_containers(spec):
        volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert volumes[mounts["/fsx"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"], where
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory", where


def test_gpu_workers_declare_gpus_consistently():
    for group in only("RayCluster")["spec"]["workerGroupSpecs"]:
        container = group["template"]["spec"]["containers"][0]
        gpus = container["resources"]["limits"][GPU]
        assert group["rayStartParams"]["num-gpus"] == str(gpus), group["groupName"]


def test_rayjob_follows_kuberay_rules_for_a_cluster_selector():
    job = only("RayJob")
    spec = job["spec"]
    assert len(job["metadata"]["name"]) <= 47
    assert spec["clusterSelector"] == {"ray.io/cluster": only("RayCluster")["metadata"]["name"]}
    assert "rayClusterSpec" not in spec
    assert spec["shutdownAfterJobFinishes"] is False, "a RayJob does not own a selected cluster"
    assert not spec.get("ttlSecondsAfterFinished"), "TTL needs shutdownAfterJobFinishes"
    assert not spec.get("suspend"), "the ClusterSelector mode cannot suspend"
    assert spec.get("submissionMode", "K8sJobMode") != "SidecarMode"
    assert spec["submitterPodTemplate"]["spec"]["restartPolicy"] == "Never"


# -- 3. agreement with the project -----------------------------------------------------------------


def test_rayjob_runs_a_registered_train_command():
    argv = rayjob_argv()
    assert argv[:2] == ["vlrl", "train"]
    problems, params = parse_cli(argv)
    assert not problems, problems
    assert params["quiet"] is True, "jobs log one line per step"


def test_rayjob_config_is_a_config_of_the_repository():
    _, params = parse_cli(rayjob_argv())
    path = params["config"]
    assert path.is_absolute() and str(path).startswith("/fsx/"), "the job reads its config from shared storage"
    assert (ROOT / "configs" / path.name).is_file(), f"no configs/{path.name} in the repository"
    job_config()  # loads and validates, overrides included


def test_cluster_fits_the_job_config():
    config = job_config()
    spec = only("RayCluster")["spec"]
    assert config.runtime.use_gpu
    gpus = sum(g["replicas"] * int(g["rayStartParams"]["num-gpus"]) for g in spec["workerGroupSpecs"])
    assert gpus == config.runtime.num_workers, f"{gpus} GPUs for {config.runtime.num_workers} one-GPU workers"
    for group in spec["workerGroupSpecs"]:
        container = group["template"]["spec"]["containers"][0]
        needed = int(group["rayStartParams"]["num-gpus"]) * config.runtime.cpus_per_worker
        assert quantity(container["resources"]["limits"]["cpu"]) >= needed, f"{group['groupName']}: CPUs per pod"


def test_model_and_runs_live_on_the_shared_mount():
    config = job_config()
    spec = only("RayCluster")["spec"]
    for where, container, _ in ray_containers(spec):
        for path in (config.model.path, config.storage.root):
            assert mount_root(path, container["volumeMounts"]) == "/fsx", f"{where}: {path} is not on /fsx"


def test_metrics_port_matches_the_config():
    config = job_config()
    for where, container, group in ray_containers(only("RayCluster")["spec"]):
        port = int(group["rayStartParams"]["metrics-export-port"])
        assert port == config.tracking.metrics_port, where
        assert {"name": "metrics", "containerPort": port} in container["ports"], f"{where}: declare the metrics port"
        annotations = group["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port), where


def test_serving_reads_the_adapter_the_job_writes():
    config = job_config()
    deployment = only("Deployment")
    argv = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[:2] == ["vlrl", "serve"]
    option = dict(zip(argv[2::2], argv[3::2]))
    assert option["--base"] == config.model.path
    assert option["--adapter"] == f"{config.storage.root}/{config.storage.run_name}/adapter"
    assert option["--host"] == "0.0.0.0", "the Service cannot reach a server bound to localhost"
    service = only("Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_podmonitor_scrapes_the_declared_metrics_port():
    monitor = only("PodMonitor")
    cluster = only("RayCluster")
    assert monitor["spec"]["selector"]["matchLabels"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


def _pyproject_ray_pin() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (ray,) = [d for d in extras["ray"] if d.startswith("ray")]
    return ray.split("==")[1]


# -- kustomize -------------------------------------------------------------------------------------


KUSTOMIZATIONS = sorted(K8S.rglob("kustomization.yaml"))


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=[str(p.relative_to(K8S)) for p in KUSTOMIZATIONS])
def test_kustomization_lists_existing_files_and_sets_the_image(path):
    kustomization = yaml.safe_load(path.read_text())
    assert kustomization["kind"] == "Kustomization"
    for resource in kustomization["resources"]:
        assert (path.parent / resource).is_file(), f"{path}: {resource} does not exist"
        for doc in load_yaml_docs(path.parent / resource):
            assert doc["kind"] != "Secret", f"{path}: never apply the example Secret"
            if "namespace" in doc["metadata"]:
                assert doc["metadata"]["namespace"] == kustomization["namespace"], resource
            for _, pod in pod_specs(doc):
                for container in pod["containers"]:
                    assert container["image"].split(":")[0] == "vlrl", f"{resource}: kustomize sets only `vlrl` images"
    (image,) = kustomization["images"]
    assert image["name"] == "vlrl" and image["newTag"] and image["newName"].endswith("/vlrl")


def test_all_kustomizations_set_the_same_image():
    images = {tuple(sorted(yaml.safe_load(p.read_text())["images"][0].items())) for p in KUSTOMIZATIONS}
    assert len(images) == 1, images


def test_nothing_outside_a_kustomization_uses_the_vlrl_image_unset():
    listed = {(p.parent / r).resolve() for p in KUSTOMIZATIONS for r in yaml.safe_load(p.read_text())["resources"]}
    for path, doc in manifests():
        for _, pod in pod_specs(doc):
            if any(c["image"].split(":")[0] == "vlrl" for c in pod["containers"]):
                assert path.resolve() in listed, f"{path} uses the vlrl image but no kustomization sets it"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed (renders the kustomizations)")
@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=[str(p.relative_to(K8S)) for p in KUSTOMIZATIONS])
def test_kubectl_kustomize_renders_with_the_image(path):
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(path.parent)], capture_output=True, text=True, timeout=60, check=False
    )
    assert rendered.returncode == 0, rendered.stderr
    image = yaml.safe_load(path.read_text())["images"][0]
    expected = f"{image['newName']}:{image['newTag']}"
    docs = [d for d in yaml.load_all(rendered.stdout, Loader=yaml.SafeLoader) if d]
    images = {c["image"] for d in docs for _, pod in pod_specs(d) for c in pod["containers"]}
    assert images == {expected}, images
    for doc in docs:
        if doc["kind"] in ("RayCluster", "RayJob"):
            assert not schema_errors(doc, strict_crd_schema(doc["kind"])), doc["kind"]
