"""The vLLM lane fails, not skips, on a missing or broken vLLM; elsewhere its tests skip
(tests/vllm_lane.py). Checked by running pytest on a small test module, with vLLM absent (as
in the main environment) and with a `vllm` package that raises on import (a broken install)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"

NEEDS_VLLM = """
import pytest
from vllm_lane import require_vllm

pytestmark = pytest.mark.vllm


def test_needs_vllm():
    require_vllm()


def test_skips_for_another_reason():
    pytest.skip("no GPU here")
"""

BROKEN_VLLM = 'raise RuntimeError("operator torchvision::nms does not exist")\n'


def run_pytest(tmp_path: Path, lane: bool, broken: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_needs_vllm.py").write_text(NEEDS_VLLM)
    path = [str(TESTS), str(SRC)]
    if broken:
        (tmp_path / "site" / "vllm").mkdir(parents=True)
        (tmp_path / "site" / "vllm" / "__init__.py").write_text(BROKEN_VLLM)
        path.insert(0, str(tmp_path / "site"))
    env = {k: v for k, v in os.environ.items() if k != "VLRL_VLLM_LANE"}
    env["PYTHONPATH"] = os.pathsep.join(path)
    if lane:
        env["VLRL_VLLM_LANE"] = "1"
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "vllm_lane",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestUnknownMarkWarning",
        "test_needs_vllm.py",
    ]
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_outside_the_lane_vllm_tests_skip_even_on_a_broken_vllm(tmp_path):
    result = run_pytest(tmp_path, lane=False, broken=True)
    assert result.returncode == 0 and "2 skipped" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("broken", [False, True], ids=["absent", "broken"])
def test_in_the_lane_a_missing_or_broken_vllm_fails(tmp_path, broken):
    if not broken and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment; the absent case needs an environment without it")
    result = run_pytest(tmp_path, lane=True, broken=broken)
    assert result.returncode == 1 and "2 failed" in result.stdout, result.stdout + result.stderr
    assert "where it must run: no GPU here" in result.stdout  # a plain skip of a vllm test fails too
    if broken:
        assert "torchvision::nms does not exist" in result.stdout
