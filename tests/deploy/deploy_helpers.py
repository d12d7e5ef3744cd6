"""Helpers for the deployment tests: manifests, the KubeRay CRD schemas, pod specs, vlrl command lines.

No Kubernetes runs here, so the manifests are checked the way an API server and the KubeRay operator
would look at them: against the CRDs' openAPIV3Schema (made strict so a misspelt field fails), plus
the operator's own rules and the pod-level rules that a schema cannot express.
"""

from __future__ import annotations

import copy
import functools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
# shared/ sits beside the repository: /work/shared for /work/main, <clone>/../shared in CI.
SHARED = Path(__file__).resolve().parents[2].parent / "shared"
CRD_DIR = SHARED / "kuberay-crds"

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_docs(path: Path) -> list[dict]:
    """Every non-empty YAML document of a file."""
    with path.open() as f:
        return [doc for doc in yaml.load_all(f, Loader=_LOADER) if doc is not None]


def manifest_files() -> list[Path]:
    """All Kubernetes YAML files under deploy/k8s (kustomizations excluded)."""
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def manifests() -> list[tuple[Path, dict]]:
    """(file, object) for every Kubernetes object under deploy/k8s."""
    return [(path, doc) for path in manifest_files() for doc in load_yaml_docs(path)]


def objects_of_kind(kind: str) -> list[tuple[Path, dict]]:
    """(file, object) for every object of this kind."""
    return [(path, doc) for path, doc in manifests() if doc.get("kind") == kind]


def only(kind: str) -> dict:
    """The single object of this kind under deploy/k8s."""
    found = objects_of_kind(kind)
    assert len(found) == 1, f"expected one {kind}, found {[str(p) for p, _ in found]}"
    return found[0][1]


# -- CRD schemas ---------------------------------------------------------------------------------


@functools.cache
def _crd_schemas() -> dict[str, dict]:
    if not CRD_DIR.is_dir():
        return {}
    schemas = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=_LOADER)
        if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
            continue
        for version in crd["spec"]["versions"]:
            if version["name"] == "v1":
                schemas[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return schemas


def crd_schema(kind: str) -> dict:
    """The ray.io/v1 openAPIV3Schema of a KubeRay kind; skips the test when shared/ is not there."""
    schemas = _crd_schemas()
    if not schemas:
        pytest.skip(f"KubeRay CRDs not found at {CRD_DIR} (shared/ must sit beside the repository)")
    assert kind in schemas, f"no ray.io/v1 CRD for {kind} in {CRD_DIR}"
    return schemas[kind]


def strict(schema: dict) -> dict:
    """A copy of a structural schema that rejects unknown fields.

    CRD schemas accept fields they do not list (the API server prunes them silently), so a misspelt
    key would pass. Every object schema that lists `properties` and neither sets
    `additionalProperties` nor preserves unknown fields gets `additionalProperties: false`.
    """
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@functools.cache
def strict_crd_schema(kind: str) -> dict:
    """strict() of a CRD's schema, computed once (treat as read-only)."""
    return strict(crd_schema(kind))


def pod_spec_schema() -> dict:
    """The core/v1 PodSpec schema embedded in the RayCluster CRD, strict (treat as read-only)."""
    spec = strict_crd_schema("RayCluster")["properties"]["spec"]["properties"]
    return spec["headGroupSpec"]["properties"]["template"]["properties"]["spec"]


def schema_errors(obj: dict, schema: dict) -> list[str]:
    """Readable validation errors of obj against an OpenAPI v3 (JSON-schema compatible) schema."""
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    return sorted(
        f"{'.'.join(str(p) for p in err.absolute_path) or '<root>'}: {err.message}"
        for err in validator.iter_errors(obj)
    )


# -- pods ----------------------------------------------------------------------------------------


def pod_specs(obj: dict) -> Iterator[tuple[str, dict]]:
    """(where, PodSpec) for every pod an object creates."""
    kind, spec = obj.get("kind"), obj.get("spec", {})
    if kind == "Pod":
        yield "pod", spec
    elif kind in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
        yield "template", spec["template"]["spec"]
    elif kind == "RayCluster":
        yield from _ray_cluster_pods(spec)
    elif kind == "RayJob":
        if "rayClusterSpec" in spec:
            yield from _ray_cluster_pods(spec["rayClusterSpec"])
        if "submitterPodTemplate" in spec:
            yield "submitter", spec["submitterPodTemplate"]["spec"]


def _ray_cluster_pods(spec: dict) -> Iterator[tuple[str, dict]]:
    yield "head", spec["headGroupSpec"]["template"]["spec"]
    for group in spec.get("workerGroupSpecs", []):
        yield f"worker group {group['groupName']}", group["template"]["spec"]


def ray_containers(cluster_spec: dict) -> Iterator[tuple[str, dict, dict]]:
    """(where, ray container, group) of the head and each worker group; KubeRay uses container 0."""
    head = cluster_spec["headGroupSpec"]
    yield "head", head["template"]["spec"]["containers"][0], head
    for group in cluster_spec.get("workerGroupSpecs", []):
        yield f"worker group {group['groupName']}", group["template"]["spec"]["containers"][0], group


def env_of(container: dict) -> dict[str, dict]:
    """A container's env entries by name."""
    return {entry["name"]: entry for entry in container.get("env", [])}


_SUFFIXES = {
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value: str | int | float) -> float:
    """A Kubernetes resource quantity ("500m", "16", "160Gi", 2) as a number."""
    if isinstance(value, (int, float)):
        return float(value)
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    assert match and match.group(2) in ("", *_SUFFIXES), f"not a quantity: {value!r}"
    return float(match.group(1)) * _SUFFIXES.get(match.group(2), 1.0)


# -- vlrl command lines ---------------------------------------------------------------------------

_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")"}


def vlrl_commands_in_shell(text: str) -> list[list[str]]:
    """argv of every `vlrl ...` invocation in shell text (a line, or a fenced code block).

    A command counts where `vlrl` starts a shell command, possibly after `VAR=value` assignments or
    after `--` (as in `kubectl exec POD -- vlrl ...`). Backslash continuations are joined.
    """
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if "vlrl" not in line or line.startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
        segment: list[str] = []
        for token in tokens + [";"]:
            if token in _OPERATORS:
                argv = _vlrl_argv(segment)
                if argv:
                    found.append(argv)
                segment = []
            else:
                segment.append(token)
    return found


def _vlrl_argv(segment: list[str]) -> list[str] | None:
    i = 0
    while i < len(segment) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", segment[i]):
        i += 1
    if i < len(segment) and segment[i] == "vlrl":
        return segment[i:]
    if "--" in segment:
        after = segment[segment.index("--") + 1 :]
        if after and after[0] == "vlrl":
            return after
    return None


SHELL_LANGUAGES = ("bash", "sh", "shell", "console")


def fenced_blocks(markdown: str, languages: tuple[str, ...] = SHELL_LANGUAGES) -> list[str]:
    """The contents of the fenced code blocks of a Markdown text tagged with one of `languages`."""
    blocks = re.findall(r"^```([^\n]*)\n(.*?)^```", markdown, flags=re.S | re.M)
    return [body for tag, body in blocks if tag.strip() in languages]


def inline_vlrl_commands(markdown: str) -> list[list[str]]:
    """argv of the inline code spans (outside fenced blocks) that start with `vlrl `."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return [shlex.split(span) for span in re.findall(r"`(vlrl [^`]+)`", prose)]


def parse_cli(argv: list[str]) -> tuple[list[str], dict]:
    """Parse a `vlrl ...` argv with the CLI registered in `vlrl.cli.app`, without running it.

    Walks the typer command tree by the leading words, then lets the command's own parser read the
    rest exactly as `vlrl` would: unknown options, missing arguments and bad values are problems.
    Returns (problems, parsed parameters of the command reached). Duck-typed on purpose: recent
    typer versions vendor their own click.
    """
    import typer

    from vlrl.cli import app

    assert argv and argv[0] == "vlrl", argv
    command = typer.main.get_command(app)
    path = ["vlrl"]
    args = argv[1:]
    while hasattr(command, "commands") and args and not args[0].startswith("-"):
        sub = command.commands.get(args[0])
        if sub is None:
            known = ", ".join(sorted(command.commands))
            return [f"`{' '.join(path)} {args[0]}` is not a command (known: {known})"], {}
        command, path, args = sub, path + [args[0]], args[1:]
    if hasattr(command, "commands"):
        return [f"`{' '.join(path)}` needs a subcommand"], {}
    try:
        ctx = command.make_context(" ".join(path), list(args))
    except Exception as exc:  # the (vendored) click UsageError family
        message = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
        return [f"`{' '.join(argv)}`: {message}"], {}
    return [], dict(ctx.params)
