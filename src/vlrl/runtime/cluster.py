"""Connect this process to Ray: start a local instance, or join a cluster.

`vlrl train` always runs on Ray. Without an address (`--address`, `runtime.address`, or
RAY_ADDRESS) it starts a new local Ray instance (the embedded default, object store limited by
`runtime.object_store_memory_mb`); with one it joins that cluster (`auto`: the one `ray start`
runs on this machine), and the cluster's nodes do the work.

Ray 2.60 turns token authentication on by default, and a driver whose RAY_AUTH_MODE disagrees
with the cluster's cannot join it (and worker nodes fail with InvalidAuthToken). So the mode is
always set explicitly before Ray starts: an explicit RAY_AUTH_MODE wins; otherwise `token` when a
token is at hand (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) or when we start the
local instance ourselves (Ray then writes ~/.ray/auth_token), and `disabled` when joining without
a token.

Ray itself retries a wrong address for minutes and reports a refused token as a generic
connection error after 20 s, so the address is probed first and both cases get one clear line.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from vlrl.config import RuntimeConfig
from vlrl.errors import VlrlError

GCS_PORT = 6379
CLIENT_PORT = 10001


def auth_token_source() -> str | None:
    """Where Ray would find a token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH's file, ~/.ray/auth_token), or None."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return f"RAY_AUTH_TOKEN_PATH={path}" if Path(path).expanduser().is_file() else None
    default = Path.home() / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def has_auth_token() -> bool:
    """True when Ray would find an auth token for this process."""
    return auth_token_source() is not None


def set_auth_mode(joining: bool) -> str:
    """Set RAY_AUTH_MODE explicitly (see the module docstring) and return it."""
    mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower()
    if mode not in ("", "token", "disabled"):
        raise VlrlError(
            f"RAY_AUTH_MODE={mode!r} is not a Ray auth mode; use 'token' (with RAY_AUTH_TOKEN) or 'disabled'"
        )
    if not mode:
        mode = "token" if (has_auth_token() or not joining) else "disabled"
        os.environ["RAY_AUTH_MODE"] = mode
    return mode


def apply_auth_settings() -> None:
    """Make Ray in this process see the current RAY_AUTH_* variables.

    Ray reads them into a cached config when it is imported; a mode set afterwards would reach
    the processes it starts (the GCS then refuses to run without a token) but not this one.
    This is what Ray's own token set-up and test helpers do.
    """
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # another Ray version: nothing cached the way we know
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def cluster_address(runtime: RuntimeConfig) -> str | None:
    """The address to join: `runtime.address`, else RAY_ADDRESS; None means a local instance."""
    address = (runtime.address or os.environ.get("RAY_ADDRESS") or "").strip()
    if not address or address == "local":
        return None
    if address.startswith(("http://", "https://")):
        raise VlrlError(
            f"Ray address {address} is a dashboard (Jobs API) URL; `vlrl train` joins a cluster at HEAD:{GCS_PORT} "
            f"or ray://HEAD:{CLIENT_PORT} (or submit the run there with `vlrl submit`)"
        )
    return address


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast with one line when nothing listens at the address (Ray would retry for minutes)."""
    if address == "auto":
        return
    parsed = urlparse(address if "://" in address else f"gcs://{address}")
    host = parsed.hostname
    port = parsed.port or (CLIENT_PORT if parsed.scheme == "ray" else GCS_PORT)
    if not host:
        raise VlrlError(f"Ray address {address!r} has no host; use HEAD:{GCS_PORT} or ray://HEAD:{CLIENT_PORT}")
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise VlrlError(
            f"cannot reach a Ray cluster at {address} ({reason}); check --address / RAY_ADDRESS "
            f"(the head's GCS port, usually {GCS_PORT}) and that the head node is running"
        ) from None


def connect(runtime: RuntimeConfig) -> bool:
    """Connect this process to Ray (local instance or cluster). Returns True when it connected
    here (the caller then owns the connection and may `ray.shutdown()` it), False when this
    process was already connected."""
    import ray

    if ray.is_initialized():
        return False
    address = cluster_address(runtime)
    mode = set_auth_mode(joining=address is not None)
    apply_auth_settings()
    if address is None:
        # "local": a new instance even where `ray start` left one running (join it with address=auto).
        ray.init(
            address="local",
            object_store_memory=runtime.object_store_memory_mb * 2**20,
            include_dashboard=False,
            log_to_driver=True,
        )
        return True
    _probe(address)
    try:
        ray.init(address=address)
    except (ConnectionError, RuntimeError, ray.exceptions.RayError) as exc:
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        source = auth_token_source()
        if mode == "token" and source:
            why = f"the cluster refused the token from {source}; set RAY_AUTH_TOKEN to the cluster's token"
        else:
            why = (
                f"this client sends no token (RAY_AUTH_MODE={mode}); set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to "
                "the cluster's token"
            )
        raise VlrlError(
            f"cannot join the Ray cluster at {address} ({first}); it answers, so most likely {why}"
        ) from None
    return True


def describe_resources() -> str:
    """What the cluster has in total and free now, for placement errors."""
    import ray

    def fmt(res: dict) -> str:
        keep = {k: v for k, v in res.items() if k in ("CPU", "GPU") or k.startswith("accelerator_type")}
        return ", ".join(f"{k}={v:g}" for k, v in sorted(keep.items())) or "nothing"

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return f"{len(nodes)} node(s) with {fmt(ray.cluster_resources())} in total, {fmt(ray.available_resources())} free"


def node_name() -> str:
    """`hostname (ip)` of this process's Ray node, for error messages."""
    try:
        import ray

        ip = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - a name for a message, never fatal
        ip = "?"
    return f"{socket.gethostname()} ({ip})"
