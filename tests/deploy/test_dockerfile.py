"""The Dockerfile and .dockerignore, parsed (no Docker engine here to build the image).

Checked: a pinned base image, a non-root user with the uid the manifests run as, pinned torch /
vLLM / Ray that agree with pyproject.toml, the project installed with the extras the cluster needs,
the environment lineage and offline loading rely on, and a build context without weights or venvs.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib

import pytest
from deploy_helpers import ROOT
from packaging.requirements import Requirement

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comments may also sit between continuation lines
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, rest = (pending + line).partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continuation"
    return out


def args_of(name: str) -> list[str]:
    return [rest for word, rest in instructions() if word == name]


def env_vars() -> dict[str, str]:
    env = {}
    for rest in args_of("ENV"):
        for pair in shlex.split(rest):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def run_text() -> str:
    return "\n".join(args_of("RUN"))


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pinned(package: str) -> str:
    """The version a RUN line pins `package` to (`pkg==X` or `"pkg[extra]==X"`)."""
    found = set(re.findall(rf"(?<![\w-]){re.escape(package)}(?:\[[\w,]+\])?==([\w.+]+)", run_text()))
    assert len(found) == 1, f"{package}: expected one pinned version in RUN lines, found {found or 'none'}"
    return found.pop()


def test_base_image_is_pinned():
    defaults = {}
    for word, rest in instructions():
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            defaults[key] = value
        if word == "FROM":
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1), m.group(0)), rest.split()[0])
            name, _, tag = image.rpartition(":") if "@" not in image else (image, ":", "digest")
            assert name and tag and "/" not in tag, f"FROM {image}: pin a tag"
            assert tag != "latest", f"FROM {image}: `latest` is not a pin"


def test_runs_as_uid_1000_not_root():
    users = args_of("USER")
    assert users, "no USER: the image would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("0", "root"), "the image must not run as root"
    if not user.isdigit():
        match = re.search(rf"useradd\b[^\n&;]*--uid (\d+)[^\n&;]*\b{re.escape(user)}\b", run_text())
        assert match, f"USER {user}: its uid is not set by a useradd --uid"
        user = match.group(1)
    assert user == "1000", "the manifests' securityContext runs as uid 1000"


def test_torch_vllm_and_ray_are_pinned_and_agree_with_pyproject():
    torch, _, ray = pinned("torch"), pinned("vllm"), pinned("ray")
    deps = {Requirement(d).name: Requirement(d) for d in pyproject()["dependencies"]}
    assert deps["torch"].specifier.contains(torch), f"torch {torch} is outside pyproject's {deps['torch'].specifier}"
    (ray_extra,) = [Requirement(d) for d in pyproject()["optional-dependencies"]["ray"]]
    assert ray_extra.specifier.contains(ray) and str(ray_extra.specifier) == f"=={ray}"
    assert re.search(rf'"ray\[default\]=={re.escape(ray)}"', run_text()), "install ray with its [default] extra"


def test_installs_the_project_with_the_cluster_extras():
    copies = " ".join(args_of("COPY"))
    for source in ("pyproject.toml", "README.md", "src"):
        assert re.search(rf"(^|\s){re.escape(source)}(\s|$)", copies), f"COPY {source} missing"
    match = re.search(r"pip install[^\n]*\"?\.\[([\w,]+)\]\"?", run_text())
    assert match, "no `pip install .[...]` of the project"
    extras = set(match.group(1).split(","))
    assert {"ray", "tracking", "metrics", "serve"} <= extras
    assert extras <= pyproject()["optional-dependencies"].keys()


def test_environment_for_lineage_and_offline_loading():
    env = env_vars()
    assert env.get("HF_HUB_OFFLINE") == "1"
    assert env.get("VLRL_CONTAINER_IMAGE") in ("${VLRL_CONTAINER_IMAGE}", "$VLRL_CONTAINER_IMAGE"), (
        "VLRL_CONTAINER_IMAGE must come from the build argument"
    )
    order = [(word, rest) for word, rest in instructions() if word in ("ARG", "ENV", "FROM")]
    last_from = max(i for i, (word, _) in enumerate(order) if word == "FROM")
    arg_at = [
        i for i, (word, rest) in enumerate(order) if word == "ARG" and rest.split("=")[0] == "VLRL_CONTAINER_IMAGE"
    ]
    env_at = [i for i, (word, rest) in enumerate(order) if word == "ENV" and "VLRL_CONTAINER_IMAGE=" in rest]
    assert arg_at and min(arg_at) > last_from and min(arg_at) < min(env_at), (
        "declare the ARG after FROM, before the ENV"
    )


def test_workdir_and_what_kuberay_needs_in_the_image():
    workdirs = args_of("WORKDIR")
    assert workdirs, "no WORKDIR"
    assert re.search(rf"chown [^\n]*1000[^\n]* {re.escape(workdirs[-1])}\b", run_text()), (
        "the user must own the WORKDIR"
    )
    assert re.search(r"/opt/venv/bin:\$PATH' > /etc/profile\.d/", run_text()), (
        "KubeRay runs `bash -lc ... ray start`: put the venv on a login shell's PATH"
    )
    assert env_vars()["PATH"].startswith("/opt/venv/bin:")
    installs = " ".join(re.findall(r"apt-get install[^\n]*", run_text()))
    assert "wget" in installs, "KubeRay's default probes run wget in the Ray containers"
    assert "python3.12" in installs


def test_no_weights_or_runs_are_copied_in():
    for rest in args_of("COPY") + args_of("ADD"):
        sources = [s for s in shlex.split(rest) if not s.startswith("--")][:-1]
        for source in sources:
            assert not re.search(r"runs|models?/|safetensors|\.bin$|\.pt$|\.venv", source), f"COPY {source}"


def dockerignore_patterns() -> list[str]:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` (relative to the context) out, as Docker matches it.

    A pattern is anchored at the context root and excludes what lies below a match; `**/` makes it
    match at any depth. (`!` exceptions are not used here and not handled.)
    """
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in dockerignore_patterns():
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts):
                return True
        elif any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            return True
    return False


@pytest.mark.parametrize(
    "path",
    [
        ".venv",
        ".git",
        "runs",
        "src/vlrl/__pycache__",
        ".pytest_cache",
        ".hypothesis",
        "x/model.safetensors",
        "vlrl.egg-info",
    ],
)
def test_dockerignore_excludes(path):
    assert ignored(path), f".dockerignore lets {path} into the build context"


def test_dockerignore_keeps_what_the_build_copies():
    for rest in args_of("COPY"):
        for source in [s for s in shlex.split(rest) if not s.startswith("--")][:-1]:
            assert not ignored(source), f"COPY {source} but .dockerignore excludes it"
    assert not ignored("src/vlrl/models/loading.py"), "`models` must only match the top-level folder"
