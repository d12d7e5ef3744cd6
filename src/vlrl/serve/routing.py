"""The routing layer inside vLLM's API server: API key on everything, public names, base checks.

`vlrl serve` starts `python -m vllm.entrypoints.openai.api_server ... --middleware
vlrl.serve.routing.RoutingMiddleware`; vLLM adds this ASGI middleware last, so it sees every
request first. It does five things:

1. **Authentication on every path, and roles.** vLLM 0.32's `--api-key` guards only paths under
   `/v1`, `/v2`, `/inference` and `/cohere`. With runtime LoRA updating on, it also mounts
   SageMaker's `/adapters` (load, and DELETE to unload) and `/invocations` (chat completions)
   outside those prefixes, open to anyone who reaches the port (checked on this machine). Here
   every request needs `Authorization: Bearer <token>` except the probes `/health` and
   `/vlrl/ready`. The token names an identity (`vlrl.access`): a single `--api-key` is one
   `admin`; `--tokens-dir` gives one token per identity, each with a role. Reading and querying
   needs `viewer`; changing what is served (routes, loads, unloads) `approver`; any other
   mutating path `admin` (`required_role`). A refusal is 403 naming identity, role and the role
   needed. Every attempt to change what is served, allowed or not, is one JSON line in the audit
   log (VLRL_SERVE_AUDIT_LOG, else stderr) with the acting identity.
2. **Routes.** A public name (`maze-production`) maps to an internal name (`maze-production:v3`)
   that vLLM serves; the `model` field of JSON requests is rewritten on the way in. vLLM's own
   runtime endpoints cannot alias: loading a new version `load_inplace` under the public name
   reuses its LoRA id, so requests already running switch weights halfway, and unload-then-load
   fails the requests that arrive in between. Here a swap is: load the new version under its own
   internal name (vLLM's `/v1/load_lora_adapter`), then flip the route (`POST /v1/vlrl/routes`),
   one dict assignment on the server's event loop. Every request resolves to exactly one loaded
   version, old or new, and runs on it to the end; nothing is unloaded while it is routed to or
   has requests in flight.
3. **Checks on runtime loads and unloads.** A load (`/v1/load_lora_adapter`, `/adapters`) of an
   adapter whose `vlrl_adapter.json` names other base weights than the served base is refused
   (400), naming both fingerprints. Refused with 409: unloading a version that is routed to or has
   requests in flight, `load_inplace` over a version being served, a load under a public name.
4. **Readiness.** `GET /vlrl/ready` answers 200 once every routed version is loaded in vLLM, else
   503; `GET /v1/models` also lists the public names (with `parent` = the version they route to).
5. **Metrics.** `GET /vlrl/metrics` (any identity): requests by model and status, latency
   histogram, routes (`vlrl.serve.metrics`); the serving alerts are written against them.

State comes from the environment `vlrl serve` sets: VLRL_SERVE_ROUTES (JSON {public: internal}),
VLRL_SERVE_BASE_FINGERPRINT, and either the key in VLLM_API_KEY or the identities in
VLRL_SERVE_TOKENS_DIR (+ VLRL_SERVE_ROLES), never on the command line, where `ps` would show
them; VLRL_SERVE_WATCH_TOKEN is the token of `vlrl serve --watch` itself (identity
`registry-watch`, approver). The table lives in this process only: run one API server process per model
(vLLM's default), and re-apply routes after a restart (`vlrl serve` does, from its arguments).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vlrl.access import Identities, Identity
from vlrl.errors import VlrlError
from vlrl.serve.adapters import check_public_name, recorded_base
from vlrl.serve.metrics import CONTENT_TYPE, ServeMetrics

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

OPEN_PATHS = ("/health", "/vlrl/ready")  # probes: no key needed, nothing sensitive
ROUTES_PATH = "/v1/vlrl/routes"
METRICS_PATH = "/vlrl/metrics"
LOAD_PATHS = ("/v1/load_lora_adapter", "/adapters")
UNLOAD_PATH = "/v1/unload_lora_adapter"
# POST paths that query a model (vLLM 0.32's OpenAI, SageMaker and tokenizer APIs): viewer.
QUERY_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/score",
    "/v1/rerank",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/invocations",
    "/tokenize",
    "/detokenize",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
)
WATCH_IDENTITY = Identity("registry-watch", "approver")
AUDITED_FIELDS = ("name", "target", "lora_name", "lora_path", "src")  # what a change names, in the audit log


def required_role(method: str, path: str) -> str:
    """The role a request needs: read or query -> viewer; change what is served -> approver; else admin."""
    if method in ("GET", "HEAD"):
        return "viewer"
    if path == ROUTES_PATH or path in LOAD_PATHS or path == UNLOAD_PATH or path.startswith("/adapters/"):
        return "approver"
    if path in QUERY_PATHS:
        return "viewer"
    return "admin"  # vLLM's other mutating endpoints (and any it adds later): deny by default


class RouteTable:
    """Public name -> internal name, the history of each public name, requests in flight per version."""

    def __init__(self, routes: dict[str, str], base_fingerprint: str | None):
        self.routes = dict(routes)
        self.history = {name: [target] for name, target in routes.items()}
        self.inflight: dict[str, int] = {}
        self.paths: dict[str, str] = {}  # every version seen loaded, so a rollback can re-load it
        self.base_fingerprint = base_fingerprint

    @classmethod
    def from_env(cls) -> RouteTable:
        routes = json.loads(os.environ.get("VLRL_SERVE_ROUTES") or "{}")
        return cls(routes, os.environ.get("VLRL_SERVE_BASE_FINGERPRINT") or None)

    def set(self, name: str, target: str) -> str | None:
        """Route `name` to `target`; returns the previous target."""
        previous = self.routes.get(name)
        self.routes[name] = target
        history = self.history.setdefault(name, [])
        if not history or history[-1] != target:
            history.append(target)
        return previous


_TABLE: RouteTable | None = None


def route_table() -> RouteTable:
    """The process-wide table (built from the environment on first use)."""
    global _TABLE
    if _TABLE is None:
        _TABLE = RouteTable.from_env()
    return _TABLE


def identities_from_env() -> Identities | None:
    """The identities this server accepts (None: no key configured; `vlrl serve` always sets one)."""
    tokens_dir = os.environ.get("VLRL_SERVE_TOKENS_DIR")
    if tokens_dir:
        identities = Identities.from_dir(tokens_dir, os.environ.get("VLRL_SERVE_ROLES") or None)
    else:
        keys = [k for k in (os.environ.get("VLLM_API_KEY") or "").split(",") if k]
        if not keys:
            return None
        identities = Identities({})
        for key in keys:
            identities.add(key, Identity("admin", "admin"))
    watch = os.environ.get("VLRL_SERVE_WATCH_TOKEN")
    if watch:
        identities.add(watch, WATCH_IDENTITY)
    return identities


def write_audit(entry: dict[str, Any]) -> None:
    """One JSON line: to VLRL_SERVE_AUDIT_LOG when set, else to stderr (the server's log)."""
    line = json.dumps({"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), **entry})
    path = os.environ.get("VLRL_SERVE_AUDIT_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    else:
        print(f"vlrl-audit {line}", file=sys.stderr, flush=True)


class Exchange:
    """One authenticated request: who sent it, the answer's status, the model label, audit details."""

    def __init__(self, identity: Identity | None, method: str, path: str, needed: str):
        self.identity = identity
        self.method = method
        self.path = path
        self.needed = needed
        self.status: int | None = None
        self.model = "-"
        self.details: dict[str, Any] = {}
        self.started = time.perf_counter()
        self.audited = False

    def watch(self, send: Send) -> Send:
        """`send`, noting the status of the response."""

        async def observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                self.audit()  # before the client has the whole answer, so the log is never behind it
            await send(message)

        return observed

    def audit(self) -> None:
        """Write this request's audit line, once, if it tried to change what is served."""
        if self.changes_serving and not self.audited:
            self.audited = True
            write_audit(self.audit_entry())

    @property
    def changes_serving(self) -> bool:
        return self.needed in ("approver", "admin")

    def audit_entry(self) -> dict[str, Any]:
        status = self.status or 500
        return {
            "identity": self.identity.name if self.identity else None,
            "role": self.identity.role if self.identity else None,
            "method": self.method,
            "path": self.path,
            "needs": self.needed,
            "status": status,
            "decision": "allowed" if status < 400 else "refused",
            **self.details,
        }


def _loaded_adapters(scope: Scope) -> dict[str, str] | None:
    """{internal name: path} of the adapters vLLM has loaded, or None before the app state exists."""
    app = scope.get("app")
    models = getattr(getattr(app, "state", None), "openai_serving_models", None)
    if models is None:
        return None
    return {name: req.lora_path for name, req in models.lora_requests.items()}


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            raise ConnectionError("client disconnected")
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send_json(send: Send, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _error(message: str, kind: str, status: int) -> dict[str, Any]:
    # The shape of vLLM's (and OpenAI's) errors, so the openai client shows the message.
    return {"error": {"message": message, "type": kind, "code": status}}


class RoutingMiddleware:
    """Pure ASGI middleware; see the module docstring."""

    def __init__(self, app: Callable[..., Awaitable[None]]):
        self.app = app
        self.table = route_table()
        self.identities = identities_from_env()
        self.metrics = ServeMetrics(lambda: dict(self.table.routes))

    def _identify(self, scope: Scope) -> Identity | None:
        """The identity of the request's Bearer token, or None (no or an unknown token)."""
        if self.identities is None:
            return Identity("anonymous", "admin")  # no key configured (vlrl serve always sets one)
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        return self.identities.identify(token)  # raw bytes: the token's UTF-8, as the client sent it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if scope["type"] == "websocket":
            if self._identify(scope) is None:
                await send({"type": "websocket.close", "code": 1008})
                return
            return await self.app(scope, receive, send)
        method = scope["method"]
        if path == "/vlrl/ready":
            return await self._ready(scope, send)
        if method == "OPTIONS" or path in OPEN_PATHS:  # CORS preflights carry no credentials
            return await self.app(scope, receive, send)
        identity = self._identify(scope)
        if identity is not None and method == "GET" and path == METRICS_PATH:  # not counted itself
            return await self._send_metrics(send)
        exchange = Exchange(identity, method, path, required_role(method, path))
        try:
            await self._handle(scope, receive, exchange.watch(send), path, method, exchange)
        finally:
            self.metrics.observe(exchange.model, exchange.status or 500, time.perf_counter() - exchange.started)
            exchange.audit()  # when the answer never completed (an error, a disconnect)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, path: str, method: str, exchange: Exchange
    ) -> None:
        identity = exchange.identity
        if identity is None:
            return await _send_json(send, 401, {"error": "Unauthorized"})
        if not identity.may(exchange.needed):
            message = (
                f"identity {identity.name} ({identity.role}) may not {method} {path}: "
                f"that needs the role {exchange.needed} or higher"
            )
            if method == "POST":  # the audit log says what was attempted, not only that it was refused
                try:
                    payload = json.loads(await _read_body(receive) or b"null")
                except (ValueError, ConnectionError):
                    payload = None
                if isinstance(payload, dict):
                    exchange.details.update(
                        {k: v for k, v in payload.items() if k in AUDITED_FIELDS and isinstance(v, str)}
                    )
            return await _send_json(send, 403, _error(message, "PermissionDenied", 403))
        if path == ROUTES_PATH:
            return await self._routes(scope, receive, send, exchange)
        if method == "GET" and path == "/v1/models":
            return await self._models(scope, receive, send)
        if method == "DELETE" and path.startswith("/adapters/"):  # SageMaker's unload
            exchange.details["lora_name"] = path.removeprefix("/adapters/")
            problem = self._unload_problem(path.removeprefix("/adapters/"))
            if problem:
                return await _send_json(send, 409, _error(problem, "Conflict", 409))
            return await self.app(scope, receive, send)
        # Loads and unloads are checked whatever their content type claims.
        if method == "POST" and (self._is_json(scope) or path in LOAD_PATHS or path == UNLOAD_PATH):
            return await self._json_request(scope, receive, send, path, exchange)
        return await self.app(scope, receive, send)

    async def _send_metrics(self, send: Send) -> None:
        body = self.metrics.render()
        headers = [(b"content-type", CONTENT_TYPE.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _model_label(self, model: Any) -> str:
        """A bounded label: a route, a version the server has served, else '-'."""
        table = self.table
        if model in table.routes:
            return model
        known = set(table.paths) | {t for history in table.history.values() for t in history}
        return model if model in known else "-"

    @staticmethod
    def _is_json(scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        return b"json" in headers.get(b"content-type", b"")

    # -- requests with a JSON body: rewrite the model, check loads and unloads ------------------
    async def _json_request(self, scope: Scope, receive: Receive, send: Send, path: str, exchange: Exchange) -> None:
        try:
            body = await _read_body(receive)
        except ConnectionError:
            return
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None  # vLLM answers malformed JSON itself
        target = None
        if isinstance(payload, dict):
            if exchange.changes_serving:
                exchange.details.update(
                    {k: v for k, v in payload.items() if k in AUDITED_FIELDS and isinstance(v, str)}
                )
            exchange.model = self._model_label(payload.get("model"))
            if path in LOAD_PATHS:
                conflict = self._name_conflict(
                    payload.get("lora_name") or payload.get("name"), payload.get("load_inplace")
                )
                if conflict:
                    return await _send_json(send, 409, _error(conflict, "Conflict", 409))
                problem = self._load_problem(payload.get("lora_path") or payload.get("src"))
                if problem:
                    return await _send_json(send, 400, _error(problem, "BadRequestError", 400))
            elif path == UNLOAD_PATH:
                problem = self._unload_problem(payload.get("lora_name"))
                if problem:
                    return await _send_json(send, 409, _error(problem, "Conflict", 409))
            model = payload.get("model")
            if isinstance(model, str) and model in self.table.routes:
                target = self.table.routes[model]
                payload["model"] = target
                body = json.dumps(payload).encode()
        scope = dict(scope)
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        scope["headers"].append((b"content-length", str(len(body)).encode()))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls: disconnect detection while streaming

        if target is None:
            return await self.app(scope, replay, send)
        inflight = self.table.inflight
        inflight[target] = inflight.get(target, 0) + 1
        try:
            await self.app(scope, replay, send)
        finally:
            inflight[target] -= 1
            if not inflight[target]:
                del inflight[target]

    def _load_problem(self, adapter_path: Any) -> str | None:
        if not isinstance(adapter_path, str) or not self.table.base_fingerprint:
            return None  # vLLM reports missing fields itself
        try:
            recorded = recorded_base(adapter_path)
        except VlrlError as exc:
            return str(exc)
        if recorded != self.table.base_fingerprint:
            return (
                f"adapter {adapter_path} was trained on base {recorded}, but the served base is "
                f"{self.table.base_fingerprint}; refusing to load it"
            )
        return None

    def _name_conflict(self, name: Any, inplace: Any) -> str | None:
        if name in self.table.routes:
            return f"{name} is a route (public name); load the version under its own name and route {name} to it"
        if inplace and (name in self.table.routes.values() or self.table.inflight.get(name)):
            # In place, vLLM keeps the LoRA id: requests running on this version would switch
            # weights halfway through their answer.
            return (
                f"{name} is being served; load the new weights under a new name and swap the route instead of "
                "load_inplace"
            )
        return None

    def _unload_problem(self, name: Any) -> str | None:
        routed = [public for public, target in self.table.routes.items() if target == name]
        if routed:
            return f"adapter {name} is what {', '.join(routed)} routes to; route it to another version first"
        if self.table.inflight.get(name):
            return f"adapter {name} has {self.table.inflight[name]} request(s) in flight; try again when they finish"
        return None

    # -- the route table -------------------------------------------------------------------------
    async def _routes(self, scope: Scope, receive: Receive, send: Send, exchange: Exchange) -> None:
        table = self.table
        loaded = _loaded_adapters(scope)
        table.paths.update(loaded or {})
        if scope["method"] == "POST":
            try:
                payload = json.loads(await _read_body(receive) or b"null")
            except (ValueError, ConnectionError):
                payload = None
            if (
                not isinstance(payload, dict)
                or not isinstance(payload.get("name"), str)
                or not isinstance(payload.get("target"), str)
            ):
                return await _send_json(
                    send, 400, _error('send {"name": PUBLIC, "target": INTERNAL}', "BadRequestError", 400)
                )
            name, target = payload["name"], payload["target"]
            exchange.details.update(name=name, target=target)
            try:
                check_public_name(name)
            except VlrlError as exc:
                return await _send_json(send, 400, _error(str(exc), "BadRequestError", 400))
            if loaded is not None and target not in loaded:
                message = f"adapter {target} is not loaded; load it with /v1/load_lora_adapter first"
                return await _send_json(send, 404, _error(message, "NotFoundError", 404))
            if loaded is not None and name in loaded:
                message = f"{name} is the name of a loaded adapter, not a route; choose another public name"
                return await _send_json(send, 400, _error(message, "BadRequestError", 400))
            previous = table.set(name, target)
            exchange.details["previous"] = previous
            return await _send_json(send, 200, {"name": name, "target": target, "previous": previous})
        if scope["method"] != "GET":
            return await _send_json(send, 405, _error("use GET or POST", "MethodNotAllowed", 405))
        await _send_json(
            send,
            200,
            {
                "base_fingerprint": table.base_fingerprint,
                "routes": table.routes,
                "history": table.history,
                "inflight": table.inflight,
                "adapters": loaded or {},
                "paths": table.paths,
            },
        )

    async def _ready(self, scope: Scope, send: Send) -> None:
        loaded = _loaded_adapters(scope)
        missing = sorted(t for t in self.table.routes.values() if loaded is None or t not in loaded)
        if loaded is None or missing:
            return await _send_json(send, 503, {"ready": False, "missing": missing})
        await _send_json(send, 200, {"ready": True, "routes": sorted(self.table.routes)})

    # -- /v1/models with the public names --------------------------------------------------------
    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message = {}
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, capture)
        body = b"".join(chunks)
        try:
            listing = json.loads(body)
            cards = {card["id"]: card for card in listing["data"]}
            for public, target in self.table.routes.items():
                if target in cards:
                    listing["data"].append({**cards[target], "id": public, "parent": target, "owned_by": "vlrl"})
            body = json.dumps(listing).encode()
        except (ValueError, KeyError, TypeError):
            pass  # an error response: pass it on unchanged
        headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})
