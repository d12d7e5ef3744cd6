"""Shared fixtures: one tiny "ci" model (and its processor) per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlrl.models import build_tiny_model, load_processor


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny ci model built once per test module (read-only: copy it before changing files)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", size="ci", seed=0)


@pytest.fixture(scope="module")
def processor(tiny_dir):
    return load_processor(tiny_dir)
