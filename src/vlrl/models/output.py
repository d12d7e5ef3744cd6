"""The one check before writing a model directory: what would be destroyed by writing it.

Every command that writes a model (`vlrl model build-tiny`, `vlrl sft -o`, `vlrl model
pretrain-vision -o`) replaces its output directory as a whole. So each checks it here first,
before any work, and a wrong path costs nothing and touches nothing.
"""

from __future__ import annotations

from pathlib import Path

from vlrl.errors import VlrlError


def check_output_dir(out_dir: str | Path, base_dir: str | Path | None = None, overwrite: bool = False) -> Path:
    """Refuse an output directory whose writing would destroy something; returns it as a Path.

    `out_dir` must be new or empty unless `overwrite`. It may never be the base model `base_dir`
    (the model being trained from) or a directory holding it, whatever `overwrite` says.
    """
    out = Path(out_dir)
    if base_dir is not None:
        where, base = out.expanduser().resolve(), Path(base_dir).expanduser().resolve()
        if where == base:
            raise VlrlError(f"{out} is the base model itself; write to a new directory")
        if where in base.parents:
            raise VlrlError(f"{out} holds the base model {base_dir}; write to a new directory")
    if out.exists() and not out.is_dir():
        raise VlrlError(f"{out} is a file, not a directory; choose a new directory")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise VlrlError(f"{out} already exists and is not empty; choose a new directory or overwrite it (--overwrite)")
    return out
