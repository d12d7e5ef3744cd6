"""The routing middleware's roles, audit log and metrics, over real HTTP without vLLM.

The middleware is the real one (`vlrl.serve.routing.RoutingMiddleware`), added to a Starlette
app the way vLLM adds it to its FastAPI app, and served by uvicorn on a free port. The app
behind it stands in for vLLM's few endpoints these checks touch: completions (a 500 on demand),
adapter loading (recorded where vLLM keeps it: app.state.openai_serving_models.lora_requests).
The clients are vlrl's own (`ServeClient`, `vlrl endpoint ...`). What needs vLLM itself (real
loads, swaps under load) is in test_serve_vllm.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

uvicorn = pytest.importorskip("uvicorn")
starlette = pytest.importorskip("starlette")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from vlrl.cli import app as cli  # noqa: E402
from vlrl.errors import VlrlError  # noqa: E402
from vlrl.serve import routing  # noqa: E402
from vlrl.serve.swap import ServeClient, rollback_adapter  # noqa: E402

runner = CliRunner()
ROLES = {"vic": "viewer", "tara": "trainer", "abe": "approver", "ada": "admin"}


def _stand_in_app() -> Starlette:
    async def completions(request: Request):
        body = await request.json()
        if body.get("prompt") == "fail":
            return JSONResponse({"error": {"message": "engine error"}}, status_code=500)
        return JSONResponse({"model": body.get("model"), "choices": [{"text": "ok"}]})

    async def load(request: Request):
        body = await request.json()
        request.app.state.openai_serving_models.lora_requests[body["lora_name"]] = SimpleNamespace(
            lora_path=body["lora_path"]
        )
        return JSONResponse({"loaded": body["lora_name"]})

    async def admin_only(request: Request):
        return JSONResponse({"done": True})

    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/load_lora_adapter", load, methods=["POST"]),
            Route("/reset_prefix_cache", admin_only, methods=["POST"]),
        ],
        middleware=[Middleware(routing.RoutingMiddleware)],
    )
    app.state.openai_serving_models = SimpleNamespace(
        lora_requests={
            "maze:v1": SimpleNamespace(lora_path="/adapters/v1"),
            "maze:v2": SimpleNamespace(lora_path="/adapters/v2"),
        }
    )
    return app


@pytest.fixture
def server(access_dir, tmp_path, monkeypatch):
    """The middleware behind uvicorn, identities from a tokens dir, audit log in tmp_path."""
    files = access_dir(ROLES)
    audit = tmp_path / "serve-audit.jsonl"
    monkeypatch.setenv("VLRL_SERVE_ROUTES", json.dumps({"maze": "maze:v1"}))
    monkeypatch.setenv("VLRL_SERVE_TOKENS_DIR", str(tmp_path / "access"))
    monkeypatch.setenv("VLRL_SERVE_AUDIT_LOG", str(audit))
    monkeypatch.delenv("VLRL_SERVE_BASE_FINGERPRINT", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setattr(routing, "_TABLE", None)  # the process-wide route table, rebuilt from this env
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(_stand_in_app(), host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield SimpleNamespace(
            url=f"http://127.0.0.1:{port}",
            files=files,
            token={n: f.read_text().strip() for n, f in files.items()},
            audit=audit,
        )
    finally:
        uv.should_exit = True
        thread.join(10)


def _call(url: str, method: str, path: str, token: str | None, payload: dict | None = None) -> tuple[int, dict | str]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            body = r.read().decode()
            return r.status, (json.loads(body) if r.headers.get_content_type() == "application/json" else body)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _audit(server) -> list[dict]:
    return [json.loads(line) for line in server.audit.read_text().splitlines()] if server.audit.exists() else []


def test_every_identity_reads_and_queries_unknown_tokens_get_401(server):
    for name in ROLES:
        assert _call(server.url, "GET", "/v1/vlrl/routes", server.token[name])[0] == 200
        status, body = _call(
            server.url, "POST", "/v1/completions", server.token[name], {"model": "maze", "prompt": "hi"}
        )
        assert (status, body["model"]) == (200, "maze:v1")  # the public name routed to its version
    assert _call(server.url, "GET", "/v1/vlrl/routes", "wrong-token")[0] == 401
    assert _call(server.url, "GET", "/v1/vlrl/routes", None)[0] == 401
    assert _audit(server) == []  # reading and querying change nothing: no audit entries


def test_only_approvers_change_what_is_served_and_every_attempt_is_audited(server):
    for name in ("vic", "tara"):
        with pytest.raises(
            VlrlError,
            match=f"identity {name} \\({ROLES[name]}\\) may not POST /v1/vlrl/routes: that needs the role approver",
        ):
            ServeClient(server.url, server.token[name]).route("maze", "maze:v2")
    assert ServeClient(server.url, server.token["vic"]).state()["routes"] == {"maze": "maze:v1"}  # nothing changed
    assert ServeClient(server.url, server.token["abe"]).route("maze", "maze:v2") == "maze:v1"
    result = rollback_adapter(server.url, server.token["ada"], "maze")
    assert (result.previous, result.target) == ("maze:v2", "maze:v1")
    status, _ = _call(
        server.url,
        "POST",
        "/v1/load_lora_adapter",
        server.token["tara"],
        {"lora_name": "maze:v3", "lora_path": "/a/v3"},
    )
    assert status == 403
    entries = [(e["identity"], e["role"], e["path"], e["decision"], e.get("target")) for e in _audit(server)]
    assert entries == [
        ("vic", "viewer", "/v1/vlrl/routes", "refused", "maze:v2"),
        ("tara", "trainer", "/v1/vlrl/routes", "refused", "maze:v2"),
        ("abe", "approver", "/v1/vlrl/routes", "allowed", "maze:v2"),
        ("ada", "admin", "/v1/vlrl/routes", "allowed", "maze:v1"),
        ("tara", "trainer", "/v1/load_lora_adapter", "refused", None),
    ]
    assert _audit(server)[2]["previous"] == "maze:v1" and _audit(server)[-1]["lora_path"] == "/a/v3"


def test_other_mutating_paths_need_admin(server):
    assert _call(server.url, "POST", "/reset_prefix_cache", server.token["abe"])[0] == 403
    assert _call(server.url, "POST", "/reset_prefix_cache", server.token["ada"])[0] == 200
    assert [(e["identity"], e["needs"], e["status"]) for e in _audit(server)] == [
        ("abe", "admin", 403),
        ("ada", "admin", 200),
    ]


def test_metrics_count_requests_by_model_and_status(server):
    viewer = server.token["vic"]
    for _ in range(3):
        _call(server.url, "POST", "/v1/completions", viewer, {"model": "maze", "prompt": "hi"})
    _call(server.url, "POST", "/v1/completions", viewer, {"model": "maze", "prompt": "fail"})
    _call(server.url, "POST", "/v1/completions", viewer, {"model": "some-made-up-name", "prompt": "hi"})
    _call(server.url, "GET", "/v1/vlrl/routes", "wrong-token")
    assert _call(server.url, "GET", "/vlrl/metrics", None)[0] == 401  # like every path but the probes
    status, text = _call(server.url, "GET", "/vlrl/metrics", viewer)
    assert status == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("vlrl_serve_requests_total", (("model", "maze"), ("status", "200")))] == 3
    assert samples[("vlrl_serve_requests_total", (("model", "maze"), ("status", "500")))] == 1
    assert (
        samples[("vlrl_serve_requests_total", (("model", "-"), ("status", "200")))] == 1
    )  # unknown names: one bounded label
    assert (
        samples[("vlrl_serve_requests_total", (("model", "-"), ("status", "401")))] == 2
    )  # bad token, and /vlrl/metrics without one
    assert samples[("vlrl_serve_request_seconds_count", (("model", "maze"),))] == 4
    assert 0 < samples[("vlrl_serve_request_seconds_sum", (("model", "maze"),))] < 10
    assert samples[("vlrl_serve_route_info", (("name", "maze"), ("target", "maze:v1")))] == 1


def _refusal(result) -> str:
    """The one line `vlrl` prints for a VlrlError (CliRunner keeps the exception)."""
    assert isinstance(result.exception, VlrlError), (result.output, result.exception)
    return str(result.exception)


def test_endpoint_cli_acts_with_a_token_file_and_refuses_bad_ones(server, tmp_path):
    ServeClient(server.url, server.token["abe"]).route("maze", "maze:v2")
    refused = runner.invoke(
        cli, ["endpoint", "rollback", "--url", server.url, "--name", "maze", "--api-key-file", str(server.files["vic"])]
    )
    assert "identity vic (viewer) may not POST /v1/vlrl/routes" in _refusal(refused)
    loose = tmp_path / "loose.token"
    loose.write_text(server.token["abe"] + "\n")
    loose.chmod(0o644)
    empty = tmp_path / "empty.token"
    empty.write_text("")
    empty.chmod(0o600)
    for bad, expected in (
        (loose, "readable or writable by every user"),
        (tmp_path / "none.token", "does not exist"),
        (empty, "is empty"),
    ):
        out = runner.invoke(
            cli, ["endpoint", "rollback", "--url", server.url, "--name", "maze", "--api-key-file", str(bad)]
        )
        message = _refusal(out)
        assert expected in message and "\n" not in message
    assert ServeClient(server.url, server.token["vic"]).state()["routes"] == {"maze": "maze:v2"}  # nothing changed
    ok = runner.invoke(
        cli, ["endpoint", "rollback", "--url", server.url, "--name", "maze", "--api-key-file", str(server.files["abe"])]
    )
    assert ok.exit_code == 0 and "maze: maze:v2 -> maze:v1" in ok.output, (ok.output, ok.exception)
    assert [(e["identity"], e["decision"]) for e in _audit(server)] == [
        ("abe", "allowed"),
        ("vic", "refused"),
        ("abe", "allowed"),
    ]
