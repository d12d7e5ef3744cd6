"""Hot swap and rollback of a served adapter, through the running server's HTTP endpoints.

    swap_adapter(url, api_key, "maze-production", "runs/grpo-42/adapter")

1. reads the server's route table (`GET /v1/vlrl/routes`): its base fingerprint and versions;
2. refuses an adapter trained on another base (both fingerprints named), before touching the server;
3. loads the new version under its internal name `NAME:TAG` with vLLM's `/v1/load_lora_adapter`
   (skipped when that exact version is already loaded);
4. sends it one request (1 token), so a broken adapter fails here and not in a client's request;
5. flips the public route to it (`POST /v1/vlrl/routes`): requests already running finish on the
   old version, every later one runs on the new;
6. unloads versions older than the previous one that nothing routes to and that have no request
   in flight; the previous version stays loaded, so a rollback is only a route flip.

`rollback_adapter` routes the name back to the version it served before the current one
(re-loading it from its path if it was unloaded). Nothing here needs vLLM installed: it speaks
HTTP with the standard library.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlrl.errors import VlrlError
from vlrl.serve.adapters import AdapterSpec, adapter_spec, check_public_name, verify_base


@dataclass
class SwapResult:
    """What a swap or rollback did."""

    name: str
    target: str  # internal name now routed
    previous: str | None
    loaded: bool  # False: that version was already loaded
    unloaded: list[str]
    seconds: float


class ServeClient:
    """The admin side of a `vlrl serve` server: routes, loads, unloads (JSON over HTTP, Bearer key)."""

    def __init__(self, url: str, api_key: str, timeout: float = 120.0):
        self.url = url.rstrip("/").removesuffix("/v1")
        self.api_key = api_key
        self.timeout = timeout

    def _call(self, method: str, path: str, payload: dict | None = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                error = json.loads(detail).get("error", detail)
                detail = error.get("message", error) if isinstance(error, dict) else error
            except ValueError:
                pass
            if exc.code == 401:
                raise VlrlError(
                    f"{self.url} refused the API key (401); pass the key the server was started with"
                ) from None
            if exc.code == 403:  # a known identity whose role does not allow this (the message says which)
                raise VlrlError(f"{self.url} refused {method} {path}: {detail}") from None
            raise VlrlError(f"{method} {path} failed with {exc.code}: {detail}") from None
        except OSError as exc:
            raise VlrlError(f"cannot reach the server at {self.url} ({exc}); is `vlrl serve` running there?") from None
        try:
            return json.loads(body) if body else None
        except ValueError:
            return body.decode(errors="replace")

    def state(self) -> dict[str, Any]:
        """Routes, history, requests in flight and loaded adapters ({internal name: path})."""
        return self._call("GET", "/v1/vlrl/routes")

    def load(self, internal_name: str, path: str | Path) -> None:
        self._call("POST", "/v1/load_lora_adapter", {"lora_name": internal_name, "lora_path": str(path)})

    def unload(self, internal_name: str) -> None:
        self._call("POST", "/v1/unload_lora_adapter", {"lora_name": internal_name})

    def route(self, name: str, target: str) -> str | None:
        """Point public `name` at loaded version `target`; returns the previous target."""
        return self._call("POST", "/v1/vlrl/routes", {"name": name, "target": target})["previous"]

    def probe(self, internal_name: str) -> None:
        """One 1-token request to a version, so a broken adapter fails before it takes traffic."""
        self._call(
            "POST", "/v1/completions", {"model": internal_name, "prompt": "ok", "max_tokens": 1, "temperature": 0}
        )


def _retire_old_versions(client: ServeClient, name: str, keep: set[str]) -> list[str]:
    state = client.state()
    routed = set(state["routes"].values())
    unloaded = []
    for internal in state["adapters"]:
        if internal.startswith(f"{name}:") and internal not in keep | routed and not state["inflight"].get(internal):
            try:
                client.unload(internal)
                unloaded.append(internal)
            except VlrlError:
                pass  # a request slipped in: it stays loaded until the next swap
    return unloaded


def swap_to(client: ServeClient, spec: AdapterSpec) -> SwapResult:
    """Swap `spec.name` to the version `spec` describes (see the module docstring)."""
    import time

    start = time.perf_counter()
    state = client.state()
    if state.get("base_fingerprint"):
        verify_base(spec.path, state["base_fingerprint"])
    loaded = spec.internal_name not in state["adapters"]
    if loaded:
        client.load(spec.internal_name, spec.path)
    client.probe(spec.internal_name)
    previous = client.route(spec.name, spec.internal_name)
    keep = {spec.internal_name} | ({previous} if previous else set())
    unloaded = _retire_old_versions(client, spec.name, keep)
    return SwapResult(spec.name, spec.internal_name, previous, loaded, unloaded, time.perf_counter() - start)


def swap_adapter(url: str, api_key: str, name: str, adapter_dir: str | Path, tag: str | None = None) -> SwapResult:
    """Serve `adapter_dir` under public `name` on the `vlrl serve` server at `url`, with no failed request.

    `tag` names the version (e.g. `v3` for registry version 3; default: a hash of the adapter's
    weights). The adapter directory must be readable by the server at the same path.
    """
    spec = adapter_spec(check_public_name(name), adapter_dir, tag)
    return swap_to(ServeClient(url, api_key), spec)


def rollback_adapter(url: str, api_key: str, name: str) -> SwapResult:
    """Route `name` back to the version it served before the current one."""
    import time

    start = time.perf_counter()
    client = ServeClient(url, api_key)
    state = client.state()
    current = state["routes"].get(name)
    if current is None:
        raise VlrlError(
            f"the server has no route named {name}; it routes: {', '.join(sorted(state['routes'])) or 'nothing'}"
        )
    earlier = [t for t in state["history"].get(name, []) if t != current]
    if not earlier:
        raise VlrlError(f"{name} has served only {current}; there is nothing to roll back to")
    target = earlier[-1]
    loaded = target not in state["adapters"]
    if loaded:
        paths = state.get("paths", {})
        if target not in paths:
            raise VlrlError(
                f"{target} is no longer loaded and its path is unknown; swap to it with its directory instead"
            )
        client.load(target, paths[target])
    client.probe(target)
    previous = client.route(name, target)
    return SwapResult(name, target, previous, loaded, [], time.perf_counter() - start)
