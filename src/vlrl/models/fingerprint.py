"""A stable identity for a model's weights: "sha256:<hex>".

The fingerprint covers exactly what decides the model's outputs for a given input:
  - config.json (architecture, token ids, dtype),
  - every *.safetensors file and model.safetensors.index.json (the weights),
taken in sorted file-name order; each file contributes its name, its size and its bytes.
It does NOT cover the tokenizer, processor configs, chat template, generation_config.json or
any other file, so re-saving those (or copying the directory elsewhere) keeps the fingerprint.

Adapters record the fingerprint of the base model they were trained on, so an adapter is never
silently applied to different weights. Hashing a large checkpoint takes seconds, so results are
cached in memory, keyed by the directory and each covered file's size and mtime.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from vlrl.errors import VlrlError

_CHUNK = 1 << 20
_cache: dict[tuple, str] = {}


def fingerprinted_files(model_dir: str | Path) -> list[Path]:
    """The files a fingerprint covers, in hashing order (sorted by name)."""
    path = Path(model_dir)
    if not path.is_dir():
        raise VlrlError(f"model path {path} does not exist; pass a local model directory")
    if not (path / "config.json").is_file():
        raise VlrlError(f"{path} has no config.json; it is not a Hugging Face model directory")
    weights = [p for p in path.glob("*.safetensors") if p.is_file()]
    if not weights:
        raise VlrlError(f"{path} has no *.safetensors weight files; vlrl reads safetensors checkpoints only")
    files = [path / "config.json", *weights]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files.append(index)
    return sorted(files, key=lambda p: p.name)


def model_fingerprint(model_dir: str | Path) -> str:
    """Return "sha256:<hex>" over config.json and the safetensors weights (see module docstring)."""
    files = fingerprinted_files(model_dir)
    stats = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    key = (str(Path(model_dir).resolve()), stats)
    if key in _cache:
        return _cache[key]

    digest = hashlib.sha256()
    for f in files:
        # Name and size first, so the boundaries between files are part of the hash.
        digest.update(f"{f.name}\0{f.stat().st_size}\0".encode())
        with f.open("rb") as stream:
            while chunk := stream.read(_CHUNK):
                digest.update(chunk)
    fingerprint = f"sha256:{digest.hexdigest()}"
    _cache[key] = fingerprint
    return fingerprint
