"""Model fingerprints: stable, sensitive to weights and config, blind to other files."""

from __future__ import annotations

import json
import shutil

import pytest

from vlrl.errors import VlrlError
from vlrl.models import model_fingerprint
from vlrl.models.fingerprint import fingerprinted_files


def test_format_and_covered_files(tiny_dir):
    fp = model_fingerprint(tiny_dir)
    assert fp.startswith("sha256:") and len(fp) == len("sha256:") + 64
    assert [f.name for f in fingerprinted_files(tiny_dir)] == ["config.json", "model.safetensors"]
    assert model_fingerprint(tiny_dir) == fp  # cached and stable


def test_changes_when_a_weight_byte_changes(tiny_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)
    before = model_fingerprint(copy)
    assert before == model_fingerprint(tiny_dir)  # the path is not part of the hash
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # the last byte is tensor data, not the header
    weights.write_bytes(bytes(data))
    assert model_fingerprint(copy) != before


def test_changes_with_config_but_not_with_tokenizer(tiny_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)
    before = model_fingerprint(copy)
    (copy / "chat_template.jinja").write_text("{{ messages }}")
    assert model_fingerprint(copy) == before
    config = json.loads((copy / "config.json").read_text())
    config["text_config"]["rms_norm_eps"] = 1e-5
    (copy / "config.json").write_text(json.dumps(config))
    assert model_fingerprint(copy) != before


def test_bad_directories(tmp_path):
    with pytest.raises(VlrlError, match="does not exist"):
        model_fingerprint(tmp_path / "nope")
    with pytest.raises(VlrlError, match="no config.json"):
        model_fingerprint(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(VlrlError, match="safetensors"):
        model_fingerprint(tmp_path)
