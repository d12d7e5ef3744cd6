"""Seeds and random-state capture, so runs are reproducible and resumable.

`rng_state()` is plain JSON (lists, numbers, base64 strings), so checkpoints store it without
pickle and a state captured in one process (a Ray worker) loads in another.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _bytes_to_text(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _text_to_bytes(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def rng_state() -> dict[str, Any]:
    """Every global random state of this process (Python, NumPy, torch CPU, each CUDA device), as JSON."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _bytes_to_text(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_bytes_to_text(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured. CUDA states are restored when this process has CUDA
    (a checkpoint written on GPUs resumes on CPU without them, and the reverse keeps the seeded ones)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_text_to_bytes(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        cuda = [_text_to_bytes(s) for s in state["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
