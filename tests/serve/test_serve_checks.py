"""`vlrl serve` refusals that happen before any server starts, and the pieces that need no vLLM.

These run in the main lane (no vLLM): a base mismatch must be refused before vLLM is even looked
for, naming both fingerprints. The server itself is tested in test_serve_vllm.py (vLLM lane).
"""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from vlrl.cli import app
from vlrl.errors import VlrlError

runner = CliRunner()
OTHER_BASE = "sha256:" + "0" * 64


@pytest.fixture(scope="module")
def adapters(ci_model_dir, tmp_path_factory):
    """Two real LoRA adapters on the ci model: one recording its base, one recording another base."""
    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.loading import load_policy_model
    from vlrl.models.lora import apply_lora, save_adapter

    out = tmp_path_factory.mktemp("serve-adapters")
    peft = apply_lora(load_policy_model(ci_model_dir), 8, 16, seed=0)
    good = save_adapter(peft, out / "run-a" / "adapter", model_fingerprint(ci_model_dir))
    other = save_adapter(peft, out / "other", OTHER_BASE)
    return {"good": good, "other": other, "base_fp": model_fingerprint(ci_model_dir)}


def test_base_mismatch_refuses_to_start_naming_both_fingerprints(ci_model_dir, adapters):
    r = runner.invoke(
        app,
        [
            "serve",
            "--base",
            str(ci_model_dir),
            "--adapter",
            f"good={adapters['good']}",
            "--adapter",
            f"maze={adapters['other']}",
            "--api-key",
            "k",
            "--port",
            "18999",
        ],
    )
    assert r.exit_code != 0
    message = str(r.exception)
    assert isinstance(r.exception, VlrlError), r.exception
    assert OTHER_BASE in message and adapters["base_fp"] in message and str(adapters["other"]) in message
    assert "vLLM is not installed" not in message  # refused before vLLM is looked for


def test_serve_needs_an_api_key_and_an_adapter(ci_model_dir, adapters, monkeypatch):
    monkeypatch.delenv("VLRL_API_KEY", raising=False)
    r = runner.invoke(app, ["serve", "--base", str(ci_model_dir), "--adapter", str(adapters["good"])])
    assert isinstance(r.exception, VlrlError) and "API key is required" in str(r.exception)
    r = runner.invoke(app, ["serve", "--base", str(ci_model_dir), "--api-key", "k"])
    assert isinstance(r.exception, VlrlError) and "at least one --adapter" in str(r.exception)


def test_adapter_without_a_base_record_is_refused(ci_model_dir, adapters, tmp_path):
    import shutil

    bare = shutil.copytree(adapters["good"], tmp_path / "bare")
    (bare / "vlrl_adapter.json").unlink()
    r = runner.invoke(app, ["serve", "--base", str(ci_model_dir), "--adapter", f"x={bare}", "--api-key", "k"])
    assert isinstance(r.exception, VlrlError) and "base it was trained on is unknown" in str(r.exception)


def test_adapter_names_and_versions(adapters, tmp_path):
    from vlrl.serve.adapters import adapter_spec, content_tag, parse_adapter_option, vllm_rank

    assert parse_adapter_option(f"maze={adapters['good']}") == ("maze", adapters["good"])
    assert parse_adapter_option(str(adapters["good"]))[0] == "run-a"  # RUN/adapter is named after RUN
    with pytest.raises(VlrlError, match="not valid"):
        parse_adapter_option(f"ma:ze={adapters['good']}")  # ':' separates the version tag
    spec = adapter_spec("maze", adapters["good"])
    assert spec.internal_name == f"maze:{content_tag(adapters['good'])}"
    assert content_tag(adapters["good"]) == content_tag(adapters["other"])  # same weights, same tag
    assert [vllm_rank([r]) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(VlrlError, match="does not exist"):
        adapter_spec("maze", tmp_path / "missing")


def test_vllm_command_runs_the_module_and_keeps_the_key_off_the_command_line(ci_model_dir, adapters):
    from vlrl.serve.adapters import adapter_spec
    from vlrl.serve.server import ServeOptions, server_env, vllm_command

    options = ServeOptions(
        base=ci_model_dir,
        adapters=[adapter_spec("maze", adapters["good"])],
        api_key="s3cret-key",
        port=18001,
        max_model_len=1024,
        kv_cache_mb=64,
    )
    argv = vllm_command(options, python="python")
    assert argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "s3cret-key" not in " ".join(argv)
    options_of = dict(zip(argv[3::1], argv[4::1]))
    assert options_of["--middleware"] == "vlrl.serve.routing.RoutingMiddleware"
    assert options_of["--kv-cache-memory-bytes"] == str(64 << 20) and options_of["--max-lora-rank"] == "8"
    assert options_of["--dtype"] == "float32"  # the checkpoint's: vLLM's "auto" would compute in 16 bits
    assert json.loads(options_of["--lora-modules"]) == {
        "name": adapter_spec("maze", adapters["good"]).internal_name,
        "path": str(adapters["good"].resolve()),
    }
    for extra in (["--api-server-count=2"], ["--api-key", "x"]):
        options.extra_args = extra
        with pytest.raises(VlrlError):
            vllm_command(options)  # one API server holds the route table; the key stays off argv
    env = server_env(options, "sha256:abc")
    assert env["VLLM_API_KEY"] == "s3cret-key" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert json.loads(env["VLRL_SERVE_ROUTES"]) == {"maze": adapter_spec("maze", adapters["good"]).internal_name}


def test_serve_modules_import_without_vllm_and_say_so_when_it_is_missing(ci_model_dir, adapters):
    import importlib.util

    # The CLI module and the routing middleware import without vLLM (this lane has none).
    import vlrl.cli.serve_cmd  # noqa: F401
    import vlrl.serve.routing  # noqa: F401
    from vlrl.serve import server

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here; the missing-vLLM message is checked in the main lane")
    with pytest.raises(VlrlError, match="vLLM is not installed in this Python"):
        server.require_vllm()
    r = runner.invoke(app, ["serve", "--base", str(ci_model_dir), "--adapter", str(adapters["good"]), "--api-key", "k"])
    assert isinstance(r.exception, VlrlError) and sys.executable in str(r.exception)


def test_identities_are_checked_before_the_server_starts(ci_model_dir, adapters, access_dir, tmp_path):
    files = access_dir({"abe": "approver"})
    serve = ["serve", "--base", str(ci_model_dir), "--adapter", f"maze={adapters['good']}", "--port", "18998"]
    files["abe"].chmod(0o644)
    r = runner.invoke(app, [*serve, "--tokens-dir", str(tmp_path / "access")])
    assert isinstance(r.exception, VlrlError) and "readable or writable by every user" in str(r.exception)
    assert "vLLM is not installed" not in str(r.exception)  # refused before anything else is looked at
    files["abe"].chmod(0o600)
    r = runner.invoke(app, [*serve, "--tokens-dir", str(tmp_path / "access"), "--api-key", "k"])
    assert isinstance(r.exception, VlrlError) and "not both" in str(r.exception)


def test_with_identities_the_child_gets_the_tokens_dir_and_no_single_key(
    ci_model_dir, adapters, access_dir, tmp_path, monkeypatch
):
    from vlrl.serve.adapters import adapter_spec
    from vlrl.serve.server import ServeOptions, server_env

    access_dir({"abe": "approver"})
    monkeypatch.setenv("VLLM_API_KEY", "inherited")  # must not reach vLLM: it would refuse the identities' tokens
    options = ServeOptions(
        base=ci_model_dir,
        adapters=[adapter_spec("maze", adapters["good"])],
        api_key=None,
        tokens_dir=tmp_path / "access",
        audit_log=tmp_path / "audit.jsonl",
        watch_token="w",
    )
    env = server_env(options, "sha256:abc")
    assert "VLLM_API_KEY" not in env
    assert env["VLRL_SERVE_TOKENS_DIR"] == str((tmp_path / "access").resolve())
    assert (
        env["VLRL_SERVE_AUDIT_LOG"] == str((tmp_path / "audit.jsonl").resolve())
        and env["VLRL_SERVE_WATCH_TOKEN"] == "w"
    )
