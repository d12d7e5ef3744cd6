"""Fixtures shared across test folders: one tiny "ci" model per session and configs using it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from vllm_lane import pytest_runtest_makereport  # noqa: F401 - the hook: no skipped vllm test in the vLLM lane

ROOT = Path(__file__).resolve().parents[1]


def load_bench(name: str) -> ModuleType:
    """A script of bench/ as a module (bench/ is not a package: its scripts run by path)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def ci_model_dir(tmp_path_factory) -> Path:
    """The ~0.9M-parameter tiny model, built offline once per test session (treat as read-only)."""
    from vlrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("ci-model") / "tiny-ci", size="ci", seed=0)


@pytest.fixture
def ci_config(ci_model_dir, tmp_path):
    """`ci_config(*overrides)`: configs/ci-tiny.yaml on the session model, writing under tmp_path.

    The in-process backend is the default here (fast, no Ray start); tests of the Ray runtime
    override `runtime.backend=ray`.
    """
    from vlrl.config import load_config

    def make(*overrides: str):
        base = [f"model.path={ci_model_dir}", f"storage.root={tmp_path / 'runs'}", "runtime.backend=local"]
        return load_config(ROOT / "configs" / "ci-tiny.yaml", base + list(overrides))

    return make


@pytest.fixture
def access_dir(tmp_path):
    """`access_dir({"ann": "trainer", ...}, name="access")`: NAME.token files (0600) + roles.yaml
    under tmp_path/name (vlrl.access); returns {identity: its token file}."""
    from vlrl.access import new_token

    def make(roles: dict[str, str], name: str = "access") -> dict[str, Path]:
        directory = tmp_path / name
        directory.mkdir(parents=True, exist_ok=True)
        files = {}
        for identity in roles:
            path = directory / f"{identity}.token"
            path.write_text(new_token() + "\n")
            path.chmod(0o600)
            files[identity] = path
        (directory / "roles.yaml").write_text("".join(f"{identity}: {role}\n" for identity, role in roles.items()))
        return files

    return make
