"""Checkpoints: the one place that knows how they are laid out, written, verified and chosen.

A run's checkpoints live under ROOT = RUN_DIR/checkpoints, a local path or an fsspec URL:

    ROOT/step-000006/
        adapter.safetensors      the full LoRA weights (PEFT keys), whatever the number of workers
        optimizer/               optimizer + LR-scheduler state through torch.distributed.checkpoint
                                 (DCP): one file per worker rank that held a shard + .metadata, so
                                 any number of workers can read it back (resharding)
        rng/rank-<r>.json        each worker's random states (Python, NumPy, torch CPU, CUDA)
        trainer.json             step, sampler position, split versions, metric history, evals,
                                 restarts, config changes, the stability guards' state (LR
                                 scale, rollbacks), the driver's random states
        config.yaml              the resolved config the run had when it wrote this
        manifest.json            size and SHA-256 of every file above; written last
    ROOT/latest                  "step-000006", replaced after the checkpoint is in place
    ROOT/.tmp-step-000007-<writer>/   a checkpoint being written; readers never look at it

Writing (`CheckpointStore.save`): everything goes to a temporary directory on the same storage,
each file flushed (and fsync'ed on local disks), then the manifest is built by reading the files
back, then the directory is renamed into place and `latest` updated. The rename is the commit:
on POSIX file systems it is atomic; on object stores (a copy) a half-copied directory fails its
manifest and is skipped. After the write, all but the newest `keep` checkpoints are deleted,
never the one just written. The optimizer is written by the workers themselves, each its own
FSDP shard (DCP over the run's gloo/NCCL group): no process ever holds the whole optimizer state.

Reading (`find_checkpoint`): the newest checkpoint whose manifest verifies (every file present,
same size, same SHA-256). A damaged one is reported in one log line and the previous one is
used. `latest` is for people and tools; readers go by step, so a crash between the rename and
the pointer loses nothing. Temporary directories are ignored; they are deleted only when it is
safe: our own (a write of this process that failed) or another writer's that has not changed
for `stale_after_s`. Two drivers writing one run at the same time are not supported.

Resuming with another config (`check_resume_config`): keys in `RESUME_SAFE_KEYS` may change
(recorded in the run); any other difference is refused, naming the keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import torch
import yaml

from vlrl.errors import VlrlError

log = logging.getLogger(__name__)

FORMAT = "vlrl-checkpoint/1"
MANIFEST = "manifest.json"
ADAPTER = "adapter.safetensors"
OPTIMIZER = "optimizer"
TRAINER = "trainer.json"
CONFIG = "config.yaml"
LATEST = "latest"
REQUIRED = (ADAPTER, TRAINER, CONFIG, f"{OPTIMIZER}/.metadata")
STEP_DIR = re.compile(r"^step-(\d+)$")
TEMP_DIR = re.compile(r"^\.(?:(?:tmp|old)-step-\d+|latest)-(.+)$")  # unfinished writes; group 1: the writer
STALE_AFTER_S = 24 * 3600.0
_CHUNK = 1 << 20

# Config keys (and whole sections) a resumed run may change: they do not change what the
# checkpoint's state means. Everything else is refused, including fields added to the config
# later until they are listed here. Some of these change the random stream (a resumed run stays
# the same run in distribution, not bit for bit): the worker count, GPU/CPU, the engine, its
# decoding path and batching, the attention kernel.
RESUME_SAFE_KEYS = (
    "train.steps",  # more (or fewer) steps; a decaying LR schedule follows the new total from here on
    "train.eval_every",
    "train.eval_tasks",
    "train.checkpoint_every",
    "train.max_minutes",  # each command of a time-boxed run has its own budget
    "train.keep_checkpoints",
    "train.sft",  # read by `vlrl sft` only
    "train.guards",  # e.g. a raised bound after a guard stopped the run (docs/observability.md)
    "train.compile_blocks",  # the same update, compiled or eager
    "runtime",  # address, workers (resharding), placement, timeouts, threads, restarts
    "storage",  # a moved run directory
    "tracking",
    "serving",
    "registry",
    # env.*: what the env's config class lists in `resume_safe_keys` (`env.adversarial`: evaluation only)
    "rollout.engine",
    "rollout.fast_decode",
    "rollout.compile_decode",
    "rollout.batch_size",
    "rollout.max_batch_tokens",
    "rollout.vision_cache_mb",
    "rollout.gpu_memory_utilization",
    "rollout.kv_cache_memory_mb",
    "model.path",  # a moved model: its weights' fingerprint must still match (checked separately)
    "model.init_tiny",
    "model.attn_implementation",
)


# -- storage helpers ----------------------------------------------------------------------------
def _filesystem(url: str):
    import fsspec

    return fsspec.core.url_to_fs(url)[0]


def is_url(path: str) -> bool:
    """True for fsspec URLs (s3://, memory://, file://, ...), False for plain paths."""
    return "://" in str(path)


def join(base: str, *parts: str) -> str:
    """`base/part/...` for a local path or a URL."""
    return posixpath.join(str(base), *parts) if is_url(base) else os.path.join(str(base), *parts)


def _basename(path: str) -> str:
    return posixpath.basename(str(path).rstrip("/"))


def _parent(path: str) -> str:
    path = str(path).rstrip("/")
    return path.rsplit("/", 1)[0] if is_url(path) else os.path.dirname(path)


def _write_bytes(fs, path: str, data: bytes) -> None:
    """Write a whole file and push it to the storage (fsync where there is a file descriptor)."""
    with fs.open(path, "wb") as f:
        f.write(data)
        f.flush()
        try:
            os.fsync(f.fileno())
        except (AttributeError, OSError, ValueError):  # object stores have no file descriptor
            pass


def _fsync_dir(path: str) -> None:
    """Make a rename in a local directory durable (no-op elsewhere)."""
    if is_url(path):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256(fs, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _mtime(info: dict[str, Any]) -> float | None:
    """Seconds since the epoch of a file's last change, from whatever fsspec reports."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


# -- config compatibility -----------------------------------------------------------------------
def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _env_resume_safe_keys(env_name: Any) -> tuple[str, ...]:
    """`env.KEY` for each key the env's config class says a resume may change (none for an unknown env)."""
    from vlrl.envs.base import env_config_class

    try:
        return tuple(f"env.{key}" for key in env_config_class(str(env_name)).resume_safe_keys)
    except VlrlError:
        return ()


def is_resume_safe(key: str, env_name: str | None = None) -> bool:
    """True when the dotted config key may change on resume (`RESUME_SAFE_KEYS`, and the
    `resume_safe_keys` of env `env_name`'s config class)."""
    safe_keys = RESUME_SAFE_KEYS + (_env_resume_safe_keys(env_name) if env_name else ())
    return any(key == safe or key.startswith(safe + ".") for safe in safe_keys)


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> tuple[dict[str, list], dict[str, list]]:
    """(refused, allowed): `{key: [saved value, current value]}` for every field that differs.

    Both configs are `RunConfig.model_dump(mode="json")` dicts. A key only one side has (a field
    added or removed by another vlrl version) is not compared.
    """
    a, b = _flatten(saved), _flatten(current)
    env_name = b.get("env.name") if a.get("env.name") == b.get("env.name") else None
    refused: dict[str, list] = {}
    allowed: dict[str, list] = {}
    for key in sorted(a.keys() & b.keys()):
        if a[key] != b[key]:
            (allowed if is_resume_safe(key, env_name) else refused)[key] = [a[key], b[key]]
    return refused, allowed


def check_resume_config(saved: dict[str, Any], current: dict[str, Any], where: str) -> dict[str, list]:
    """The allowed changes between a checkpoint's config and this one; a refused one is a VlrlError
    naming every differing key (one line)."""
    refused, allowed = config_changes(saved, current)
    if refused:
        shown = [f"{k} {v[0]!r} -> {v[1]!r}" for k, v in list(refused.items())[:6]]
        more = f" and {len(refused) - 6} more" if len(refused) > 6 else ""
        safe_keys = RESUME_SAFE_KEYS + _env_resume_safe_keys(current.get("env", {}).get("name"))
        raise VlrlError(
            f"cannot resume {where}: {', '.join(shown)}{more} differ from the checkpoint's config and would "
            f"change the run; resume with the checkpoint's values, or start a new run (another storage.run_name). "
            f"A resume may change only: {', '.join(safe_keys)}"
        )
    return allowed


# -- reading --------------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """A verified checkpoint, read back (the optimizer stays on storage: workers read their shards)."""

    path: str
    step: int
    adapter: dict[str, torch.Tensor]
    rng_states: list[dict[str, Any]]
    trainer: dict[str, Any]
    config: dict[str, Any]

    @property
    def optimizer_path(self) -> str:
        return join(self.path, OPTIMIZER)


def step_of(path: str) -> int | None:
    """The step of a `step-NNNNNN` checkpoint directory, else None."""
    match = STEP_DIR.match(_basename(path))
    return int(match.group(1)) if match else None


def verify(path: str) -> str | None:
    """None when the checkpoint at `path` is complete and intact, else why it is not (a phrase)."""
    fs = _filesystem(path)
    try:
        manifest = json.loads(fs.cat_file(join(path, MANIFEST)))
    except FileNotFoundError:
        return "it has no manifest.json (its write never finished)"
    except (ValueError, UnicodeDecodeError):
        return "its manifest.json is damaged"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(files, dict):
        return f"its manifest.json is not a {FORMAT} manifest"
    missing = [name for name in REQUIRED if name not in files]
    if missing:
        return f"its manifest lists no {missing[0]}"
    for rel, meta in sorted(files.items()):
        file = join(path, rel)
        try:
            size = fs.size(file)
        except FileNotFoundError:
            return f"{rel} is missing"
        if size != meta.get("size"):
            return f"{rel} has {size} bytes where the manifest says {meta.get('size')}"
        if _sha256(fs, file) != meta.get("sha256"):
            return f"{rel} does not match its SHA-256"
    return None


def read_checkpoint(path: str) -> Checkpoint:
    """Read a checkpoint (verify it first: this trusts what it reads)."""
    from safetensors.torch import load as load_safetensors

    fs = _filesystem(path)
    trainer = json.loads(fs.cat_file(join(path, TRAINER)))
    config = yaml.safe_load(fs.cat_file(join(path, CONFIG)))
    rng = [
        json.loads(fs.cat_file(join(path, "rng", f"rank-{r}.json"))) for r in range(int(trainer.get("world_size", 1)))
    ]
    adapter = load_safetensors(fs.cat_file(join(path, ADAPTER)))
    return Checkpoint(path, int(trainer["step"]), adapter, rng, trainer, config)


# -- the store ------------------------------------------------------------------------------------
class CheckpointStore:
    """The checkpoints of one run under `root` (a local path or an fsspec URL)."""

    def __init__(self, root: str | os.PathLike, keep: int = 2, stale_after_s: float = STALE_AFTER_S):
        root = str(root)
        self.root = root.rstrip("/") if is_url(root) else os.path.abspath(root)
        self.fs = _filesystem(self.root)
        self.keep = keep
        self.stale_after_s = stale_after_s
        # Names this process's temporary directories, so that it knows which leftovers are its own.
        self.writer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    # -- listing -----------------------------------------------------------------------------
    def _names(self, directories_only: bool = True) -> list[str]:
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        return sorted(_basename(e["name"]) for e in entries if e.get("type") == "directory" or not directories_only)

    def checkpoints(self) -> list[tuple[int, str]]:
        """(step, path) of every finished checkpoint directory, valid or not, newest first."""
        found = [(int(m.group(1)), join(self.root, name)) for name in self._names() if (m := STEP_DIR.match(name))]
        return sorted(found, reverse=True)

    def newest_valid(self, below: int | None = None, quiet: bool = False) -> str | None:
        """The newest checkpoint that verifies (of a step below `below` if given); damaged ones on
        the way are reported in one log line each."""
        for step, path in self.checkpoints():
            if below is not None and step >= below:
                continue
            why = verify(path)
            if why is None:
                return path
            if not quiet:
                log.warning("checkpoint %s is damaged (%s); using the one before it", path, why)
        return None

    # -- writing -----------------------------------------------------------------------------
    def save(
        self,
        step: int,
        *,
        adapter: dict[str, torch.Tensor],
        write_optimizer: Callable[[str], None],
        rng_states: list[dict[str, Any]],
        trainer: dict[str, Any],
        config_yaml: str,
    ) -> str:
        """Write checkpoint `step` (see the module docstring) and return its path.

        `write_optimizer(directory)` writes the DCP optimizer state (on a worker group every
        worker writes its shard there, so the directory must be on storage they all see).
        """
        from safetensors.torch import save as save_safetensors

        self._clean_leftovers()
        name = f"step-{step:06d}"
        tmp = join(self.root, f".tmp-{name}-{self.writer}")
        fs = self.fs
        fs.makedirs(tmp, exist_ok=True)
        _write_bytes(fs, join(tmp, ADAPTER), save_safetensors({k: v.contiguous() for k, v in adapter.items()}))
        write_optimizer(join(tmp, OPTIMIZER))
        fs.makedirs(join(tmp, "rng"), exist_ok=True)
        for rank, state in enumerate(rng_states):
            _write_bytes(fs, join(tmp, "rng", f"rank-{rank}.json"), json.dumps(state).encode())
        _write_bytes(
            fs, join(tmp, TRAINER), json.dumps({**trainer, "step": step, "world_size": len(rng_states)}).encode()
        )
        _write_bytes(fs, join(tmp, CONFIG), config_yaml.encode())
        manifest = self._manifest(tmp, step, len(rng_states))
        _write_bytes(fs, join(tmp, MANIFEST), json.dumps(manifest, indent=1).encode())

        final = join(self.root, name)
        old = None
        if fs.exists(final):  # the same step again (a run resumed past an unfinished one): swap it out
            old = join(self.root, f".old-{name}-{self.writer}")
            fs.mv(final, old, recursive=True)
        fs.mv(tmp, final, recursive=True)
        _fsync_dir(self.root)
        pointer = join(self.root, f".{LATEST}-{self.writer}")
        _write_bytes(fs, pointer, name.encode())
        fs.mv(pointer, join(self.root, LATEST))
        _fsync_dir(self.root)
        if old is not None:
            fs.rm(old, recursive=True)
        self._prune(final)
        return final

    def _manifest(self, directory: str, step: int, world_size: int) -> dict[str, Any]:
        """Size and SHA-256 of every file under `directory`, read back from the storage."""
        fs = self.fs
        base = fs._strip_protocol(directory).rstrip("/")
        files = {}
        for found in sorted(fs.find(directory)):
            rel = found[len(base) + 1 :]
            files[rel] = {"size": fs.size(found), "sha256": _sha256(fs, found)}
        for name in REQUIRED:
            if name not in files:
                raise VlrlError(
                    f"checkpoint step {step}: {name} was not written to {directory} (or is not visible from the "
                    "driver); storage.root must be storage every node shares"
                )
        self._check_optimizer_shards(join(directory, OPTIMIZER), files)
        return {"format": FORMAT, "step": step, "world_size": world_size, "created": time.time(), "files": files}

    def _check_optimizer_shards(self, directory: str, files: dict[str, Any]) -> None:
        """Every shard file the DCP metadata refers to must be visible here (shared storage)."""
        from vlrl.runtime.distributed import dcp_storage

        metadata = dcp_storage(directory, write=False).read_metadata()
        needed = {f"{OPTIMIZER}/{info.relative_path}" for info in (metadata.storage_data or {}).values()}
        missing = sorted(needed - files.keys())
        if missing:
            raise VlrlError(
                f"optimizer shard {missing[0]} written by a worker is not visible in {directory}; "
                "storage.root must be storage every node shares"
            )

    def _prune(self, newest: str) -> None:
        """Keep the newest `keep` checkpoints by step; never delete `newest` (the one just written)."""
        for i, (_, path) in enumerate(self.checkpoints()):
            if i >= self.keep and path != newest:
                self.fs.rm(path, recursive=True)

    def _clean_leftovers(self) -> None:
        """Delete temporary directories when it is safe: this writer's own (a write that failed
        here) or another writer's that has not changed for `stale_after_s` (its writer is gone)."""
        now = time.time()
        for name in self._names(directories_only=False):
            match = TEMP_DIR.match(name)
            if not match:
                continue
            path = join(self.root, name)
            if match.group(1) != self.writer:
                times = [_mtime(info) for info in self.fs.find(path, detail=True).values()] or [
                    _mtime(self.fs.info(path))
                ]
                if any(t is None for t in times) or now - max(times) < self.stale_after_s:
                    continue  # maybe another process still writing it: leave it alone
            log.info("removing the unfinished checkpoint write %s", path)
            self.fs.rm(path, recursive=True)

    def remove_newer_than(self, step: int) -> None:
        """Before a run continues from `step`: checkpoints of later steps belong to the abandoned
        future. Damaged ones are deleted; intact ones (only when resuming an older checkpoint on
        purpose) are renamed `abandoned-step-N-<time>`, kept for you to delete."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for later, path in self.checkpoints():
            if later <= step:
                continue
            why = verify(path)
            if why is None:
                aside = join(self.root, f"abandoned-{_basename(path)}-{stamp}")
                log.warning("checkpoint %s is newer than the resumed step %d: moved to %s", path, step, aside)
                self.fs.mv(path, aside, recursive=True)
            else:
                log.info("deleting %s, newer than the resumed step %d and damaged (%s)", path, step, why)
                self.fs.rm(path, recursive=True)


# -- choosing a checkpoint --------------------------------------------------------------------------
def find_checkpoint(spec: str, run_checkpoints: str, quiet: bool = False) -> str | None:
    """The checkpoint to resume: `auto` (the newest valid one under the run's checkpoint root, or
    None when it has none) or a path: a checkpoint directory, a checkpoints root, a run directory
    or a `latest` file. A damaged checkpoint falls back to the newest valid one before it; a path
    with no valid checkpoint at all is a VlrlError."""
    if spec == "auto":
        return CheckpointStore(run_checkpoints).newest_valid(quiet=quiet)
    path = str(spec).rstrip("/") if is_url(spec) else os.path.abspath(spec)
    fs = _filesystem(path)
    if _basename(path) == LATEST and fs.isfile(path):
        path = _parent(path)
    if step_of(path) is not None or fs.exists(join(path, MANIFEST)):
        if not fs.isdir(path):
            raise VlrlError(f"--resume {spec}: no such checkpoint directory")
        why = verify(path)
        if why is None:
            return path
        store = CheckpointStore(_parent(path))
        step = step_of(path)
        previous = store.newest_valid(below=step, quiet=quiet) if step is not None else None
        if previous is None:
            raise VlrlError(f"--resume {spec}: the checkpoint is damaged ({why}) and there is no valid one before it")
        if not quiet:
            log.warning("checkpoint %s is damaged (%s); using %s", path, why, previous)
        return previous
    if fs.isdir(join(path, "checkpoints")):
        path = join(path, "checkpoints")
    if not fs.isdir(path):
        raise VlrlError(f"--resume {spec}: no such checkpoint, checkpoints directory or run directory")
    found = CheckpointStore(path).newest_valid(quiet=quiet)
    if found is None:
        raise VlrlError(f"--resume {spec}: no valid checkpoint in {path}")
    return found


def run_dir_of(checkpoint_path: str) -> str:
    """The run directory a checkpoint belongs to (RUN_DIR/checkpoints/step-N -> RUN_DIR)."""
    return _parent(_parent(checkpoint_path))
