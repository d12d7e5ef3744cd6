"""The layering of vlrl (`.importlinter`, docs/architecture.md "Layers") holds, and each contract
catches the import cycles it exists to keep cut.

The violations are injected into a copy of the sources, so the checks run on code exactly like
ours with one import added; import-linter reads imports without running them, and an import
inside a function counts like any other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".importlinter"


def lint_imports(src: Path, *contracts: str) -> subprocess.CompletedProcess:
    """`lint-imports` with the project's contracts over the package under `src`."""
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        pytest.fail(
            "lint-imports is not installed next to this Python; install the test extra (pip install -e '.[test]')"
        )
    args = [str(exe), str(CONFIG), "--no-cache", "--no-logo"]
    for contract in contracts:
        args += ["--contract", contract]
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=src.parent, timeout=120)


def test_the_sources_keep_every_contract():
    result = lint_imports(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout, result.stdout  # none dropped from .importlinter


# (module to edit, the import added to it, the contract that must break)
VIOLATIONS = [
    # The three cycles issue 19 cut, and the package-level ones found with them.
    pytest.param("runtime/worker_group.py", "vlrl.training.worker", "layers", id="runtime-imports-training"),
    pytest.param("rollout/engine.py", "vlrl.rollout.vllm_engine", "rollout", id="engine-interface-imports-vllm-engine"),
    pytest.param("envs/base.py", "vlrl.rollout.sequence", "layers", id="envs-import-rollout"),
    pytest.param("config/train.py", "vlrl.models.loading", "layers", id="config-imports-models"),
    pytest.param("envs/base.py", "vlrl.config", "layers", id="envs-import-config"),
    pytest.param("sections.py", "vlrl.envs.config", "layers", id="sections-import-envs"),
    pytest.param("eval/protocol.py", "vlrl.training.worker", "layers", id="eval-imports-training"),
    pytest.param("tracking/gate.py", "vlrl.eval.protocol", "layers", id="tracking-imports-eval-protocol"),
    # Independent siblings and the lower layers.
    pytest.param("serve/play.py", "vlrl.demo", "layers", id="serve-imports-demo"),
    pytest.param("models/lora.py", "vlrl.algo.grpo", "layers", id="models-import-algo"),
    pytest.param("errors.py", "vlrl.config", "layers", id="errors-import-config"),
    # Inside packages.
    pytest.param("rollout/hf_engine.py", "vlrl.rollout.vllm_engine", "rollout", id="engine-imports-engine"),
    pytest.param("rollout/static_decoder.py", "vlrl.rollout.hf_engine", "rollout", id="decoder-imports-engine"),
    pytest.param("training/recovery.py", "vlrl.training.trainer", "training", id="recovery-imports-trainer"),
    pytest.param("training/sft.py", "vlrl.training.worker", "training", id="sft-imports-worker"),
    pytest.param("eval/stats.py", "vlrl.eval.evaluate", "eval", id="stats-import-evaluate"),
]


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory) -> Path:
    """A pristine copy of src/vlrl; each test copies it again before editing."""
    dest = tmp_path_factory.mktemp("vlrl-src") / "src"
    shutil.copytree(ROOT / "src" / "vlrl", dest / "vlrl", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def edited_copy(clean: Path, tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(clean, src)
    return src


@pytest.mark.parametrize("module, imported, contract", VIOLATIONS)
def test_a_contract_breaks_when_its_rule_is_broken(clean_copy, tmp_path, module, imported, contract):
    src = edited_copy(clean_copy, tmp_path)
    path = src / "vlrl" / module
    # A lazy import, the kind the cycles hid behind.
    path.write_text(path.read_text() + f"\n\ndef _added_for_the_test():\n    import {imported}  # noqa: F401\n")
    result = lint_imports(src, contract)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    importer = "vlrl." + module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {imported}" in result.stdout, result.stdout  # named in the report


def test_a_new_top_level_package_must_be_placed_in_a_layer(clean_copy, tmp_path):
    src = edited_copy(clean_copy, tmp_path)
    (src / "vlrl" / "newpkg").mkdir()
    (src / "vlrl" / "newpkg" / "__init__.py").write_text("")
    result = lint_imports(src, "layers")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "vlrl.newpkg" in result.stdout + result.stderr
