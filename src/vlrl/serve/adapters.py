"""Which adapters a server may serve, under which names, checked against the base before use.

Every adapter is served under two names:
  - its *public* name (`maze`, `maze-production`): what clients put in `model`; it is a route,
    and a swap moves it from one version to the next;
  - its *internal* name `PUBLIC:TAG`, the name vLLM knows it by. TAG is `v<N>` for a registry
    version, else the first 10 hex digits of a hash of the adapter's weights and config, so the
    same adapter content always gets the same internal name (swapping it in twice is a no-op).

Responses carry the internal name in their `model` field, so a client can tell which version
answered each request.

The base check: a vlrl adapter directory records the fingerprint of the base weights it was
trained on (`vlrl_adapter.json`, see `vlrl.models.lora`); it must equal the fingerprint of the
base being served, else the adapter is refused with both fingerprints named.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from vlrl.errors import VlrlError

# Same file name as vlrl.models.lora.ADAPTER_RECORD. Not imported from there: this module also runs
# inside the vLLM server process (routing.py), where importing vlrl.models would pull in peft.
ADAPTER_RECORD = "vlrl_adapter.json"

# vLLM accepts these ranks only (vllm/config/lora.py, MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter to serve: its public name, its directory and its version tag."""

    name: str
    path: Path
    tag: str

    @property
    def internal_name(self) -> str:
        """The name vLLM serves this exact version under (`name:tag`)."""
        return f"{self.name}:{self.tag}"


def check_public_name(name: str) -> str:
    """A public adapter name: letters, digits, `.`, `_`, `-` (no `:`, which separates the tag)."""
    if not _NAME.fullmatch(name or ""):
        raise VlrlError(
            f"adapter name {name!r} is not valid; use letters, digits, '.', '_' or '-' (at most 64 characters)"
        )
    return name


def default_name(path: Path) -> str:
    """Public name of an adapter given as a bare path: its directory name, or the run's name for
    the usual `RUN/adapter` layout (so `runs/qwen3vl-8b-maze/adapter` is served as `qwen3vl-8b-maze`)."""
    resolved = Path(path).resolve()
    name = resolved.parent.name if resolved.name == "adapter" and resolved.parent.name else resolved.name
    return re.sub(r"[^A-Za-z0-9._-]", "-", name).lstrip(".-_") or "adapter"


def content_tag(adapter_dir: str | Path) -> str:
    """First 10 hex digits of sha256 over the adapter's weights and config (what decides outputs)."""
    path = Path(adapter_dir)
    digest = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.suffix == ".safetensors" or p.name == "adapter_config.json")
    if not files:
        raise VlrlError(f"{path} has no adapter weights (*.safetensors); it is not a PEFT adapter directory")
    for f in files:
        digest.update(f"{f.name}\0{f.stat().st_size}\0".encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()[:10]


def parse_adapter_option(value: str) -> tuple[str, Path]:
    """`NAME=PATH` or a bare `PATH` (named by `default_name`)."""
    name, sep, path = value.partition("=")
    if sep and name and "/" not in name:
        return check_public_name(name), Path(path)
    return default_name(Path(value)), Path(value)


def adapter_spec(name: str, path: str | Path, tag: str | None = None) -> AdapterSpec:
    """An AdapterSpec for a directory that must exist and be a PEFT adapter (tag: content hash)."""
    directory = Path(path)
    if not directory.is_dir():
        raise VlrlError(f"adapter {directory} does not exist; pass a directory written by vlrl (sft, train)")
    if not (directory / "adapter_config.json").is_file():
        raise VlrlError(f"{directory} has no adapter_config.json; it is not a PEFT adapter directory")
    return AdapterSpec(check_public_name(name), directory.resolve(), tag or content_tag(directory))


def recorded_base(adapter_dir: str | Path) -> str:
    """The base fingerprint an adapter directory records (VlrlError when it records none)."""
    record_file = Path(adapter_dir) / ADAPTER_RECORD
    if not record_file.is_file():
        raise VlrlError(
            f"adapter {adapter_dir} has no {ADAPTER_RECORD}, so the base it was trained on is unknown; "
            "vlrl serves only adapters that record their base"
        )
    try:
        fingerprint = json.loads(record_file.read_text(encoding="utf-8")).get("base_fingerprint")
    except (OSError, ValueError) as exc:
        raise VlrlError(f"{record_file} is not readable JSON ({exc})") from None
    if not isinstance(fingerprint, str) or not fingerprint.startswith("sha256:"):
        raise VlrlError(f"{record_file} has no valid base_fingerprint (got {fingerprint!r})")
    return fingerprint


def adapter_rank(adapter_dir: str | Path) -> int:
    """The LoRA rank `r` from adapter_config.json."""
    config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text(encoding="utf-8"))
    return int(config.get("r", 8))


def verify_base(adapter_dir: str | Path, base_fingerprint: str) -> None:
    """Refuse an adapter trained on other base weights, naming both fingerprints, and one with
    LoRA on the vision tower, which vLLM would serve without it (models/vision_merge.py)."""
    from vlrl.models.vision_merge import vision_tensor_count

    vision = vision_tensor_count(adapter_dir)
    if vision:
        raise VlrlError(
            f"adapter {adapter_dir} has LoRA on the vision tower ({vision} tensors), which vLLM ignores "
            "(vllm-project/vllm#32541): the endpoint would serve another policy than the one trained; split it "
            f"with `vlrl model merge-vision {adapter_dir} --base BASE -o OUT` and serve OUT/adapter on OUT/base"
        )
    recorded = recorded_base(adapter_dir)
    if recorded != base_fingerprint:
        raise VlrlError(
            f"adapter {adapter_dir} was trained on base {recorded}, but the served base is {base_fingerprint}; "
            "serve it with the base it was trained on"
        )


def vllm_rank(ranks: list[int]) -> int:
    """The smallest rank vLLM accepts as `--max-lora-rank` that fits every given rank."""
    need = max(ranks, default=8)
    for rank in VLLM_LORA_RANKS:
        if rank >= need:
            return rank
    raise VlrlError(f"LoRA rank {need} is above vLLM's largest supported rank {VLLM_LORA_RANKS[-1]}")
