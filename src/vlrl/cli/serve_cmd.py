"""`vlrl serve`, `vlrl play` and `vlrl endpoint status|swap|rollback`.

Importable without vLLM: `vlrl serve` checks for it when it runs. Guide: docs/serving.md.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import typer

from vlrl.cli.train_cmd import console
from vlrl.errors import VlrlError

endpoint_app = typer.Typer(
    no_args_is_help=True, help="Routes of a running `vlrl serve` server: status, hot swap, rollback."
)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("play")(play)
    app.add_typer(
        endpoint_app, name="endpoint", help="Routes of a running `vlrl serve` server: status, hot swap, rollback."
    )


def resolve_api_key(api_key: str | None, api_key_file: Path | None = None) -> str:
    """--api-key, else the file of --api-key-file, else VLRL_API_KEY; one of them is required.

    A key file is a token file (`vlrl.access.read_token_file`): missing, empty or readable by
    every user is refused.
    """
    from vlrl.access import read_token_file

    if api_key_file is not None:
        api_key = read_token_file(api_key_file)
    api_key = api_key or os.environ.get("VLRL_API_KEY", "")
    if not api_key:
        raise VlrlError("an API key is required: pass --api-key KEY, --api-key-file PATH or set VLRL_API_KEY")
    return api_key


API_KEY_HELP = (
    "API key or identity token (default: $VLRL_API_KEY). Prefer the environment or --api-key-file: a command line is "
    "visible to other users."
)
KEY_FILE = typer.Option(
    None, "--api-key-file", help="Read the key or identity token from this file (mode 600; not readable by every user)."
)


def serve(
    base: Path | None = typer.Option(
        None, "--base", help="Base model directory (local; its fingerprint must match every adapter's). Required."
    ),
    adapter: list[str] = typer.Option(
        [],
        "--adapter",
        "-a",
        help="[NAME=]PATH of an adapter; repeat for several. A bare PATH is named after its run directory.",
    ),
    registry: list[str] = typer.Option(
        [],
        "--registry",
        "-r",
        help="NAME@ALIAS of the model registry, served as NAME-ALIAS (e.g. maze@production -> maze-production).",
    ),
    host: str | None = typer.Option(
        None, "--host", help="Bind address (default serving.host, 127.0.0.1; 0.0.0.0 in a pod)."
    ),
    port: int | None = typer.Option(None, "--port", help="Port (default serving.port, 8000)."),
    api_key: str | None = typer.Option(None, "--api-key", help=API_KEY_HELP),
    api_key_file: Path | None = typer.Option(
        None,
        "--api-key-file",
        help="Read the API key from this file (e.g. a mounted Kubernetes Secret); its holder is identity `admin`.",
    ),
    tokens_dir: Path | None = typer.Option(
        None,
        "--tokens-dir",
        help=(
            "Identities instead of one key: NAME.token files (one per identity) and roles.yaml (NAME: "
            "viewer|trainer|approver|admin). docs/security.md."
        ),
    ),
    roles: Path | None = typer.Option(
        None, "--roles", help="With --tokens-dir: the roles file (default: TOKENS_DIR/roles.yaml)."
    ),
    audit_log: Path | None = typer.Option(
        None,
        "--audit-log",
        help=(
            "Append every route change, load and unload (allowed or refused, with the identity) to this JSONL file "
            "(default: the server's log)."
        ),
    ),
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", help="Longest request in tokens (default serving.max_model_len)."
    ),
    max_loras: int | None = typer.Option(
        None, "--max-loras", help="Adapters resident at once (default serving.max_loras)."
    ),
    max_lora_rank: int | None = typer.Option(
        None,
        "--max-lora-rank",
        help="Largest LoRA rank accepted, also for later swaps (default: fits the adapters given).",
    ),
    kv_cache_mb: int | None = typer.Option(
        None, "--kv-cache-mb", help="KV cache in MiB (default: vLLM's on GPU, 256 on CPU)."
    ),
    max_images: int | None = typer.Option(
        None, "--max-images", help="Images per request (default serving.max_images)."
    ),
    registry_uri: str | None = typer.Option(
        None,
        "--registry-uri",
        help="Model registry (MLflow URI or .db path); default: the config's registry.uri, else its tracking store.",
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", help="float32 | bfloat16 | float16 (default: the dtype the base's weights are stored in)."
    ),
    watch: float = typer.Option(
        0.0,
        "--watch",
        help=(
            "With --registry: check the aliases every this many seconds and hot-swap on a promotion or rollback (0: "
            "off)."
        ),
    ),
    vllm_arg: list[str] = typer.Option(
        [], "--vllm-arg", help="Extra argument for vLLM's server, e.g. --vllm-arg=--max-num-seqs=64; repeat."
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Run config whose `serving` section gives the defaults."
    ),
) -> None:
    """Serve a base model with LoRA adapters through vLLM's OpenAI-compatible API, API key required.

    Every adapter's recorded base fingerprint is checked against --base first; a mismatch refuses
    to start. Probes (no key): GET /health, GET /vlrl/ready. Stops on SIGTERM / Ctrl-C.

    Example: vlrl serve --base runs/models/tiny-demo-ci --adapter maze=runs/demo/grpo/adapter --port 8000
    """
    from vlrl.config import load_config
    from vlrl.serve.adapters import adapter_spec, parse_adapter_option
    from vlrl.serve.server import ServeOptions, VllmServer

    if base is None:  # checked here, not by the parser, so prose that names `vlrl serve` parses
        raise VlrlError("--base MODEL_DIR is required: the base model the adapters were trained on")
    if tokens_dir is not None:
        from vlrl.access import Identities, new_token

        if api_key or api_key_file:
            raise VlrlError(
                "give either --tokens-dir (one token per identity) or --api-key/--api-key-file (one admin key), "
                "not both"
            )
        Identities.from_dir(tokens_dir, roles)  # every token file and role checked before anything starts
        key = new_token() if watch else None  # the watcher's own token (identity registry-watch, approver)
    else:
        if roles is not None:
            raise VlrlError("--roles needs --tokens-dir")
        key = resolve_api_key(api_key, api_key_file)
    s = load_config(config, []).serving
    specs = [adapter_spec(*parse_adapter_option(value)) for value in adapter]
    watched = []
    if registry:
        from vlrl.serve.from_registry import registry_adapter

        for ref in registry:
            spec, version = registry_adapter(ref, config, registry_uri)
            specs.append(spec)
            watched.append((ref, spec.name, version))
    if watch and not registry:
        raise VlrlError("--watch follows registry aliases; it needs --registry NAME@ALIAS")
    options = ServeOptions(
        base=base,
        adapters=specs,
        api_key=key,
        host=host or s.host,
        port=port or s.port,
        max_model_len=max_model_len or s.max_model_len,
        max_loras=max_loras or s.max_loras,
        max_lora_rank=max_lora_rank or s.max_lora_rank,
        kv_cache_mb=kv_cache_mb or s.kv_cache_mb,
        max_images=max_images or s.max_images,
        dtype=dtype,
        extra_args=list(vllm_arg),
        tokens_dir=tokens_dir,
        roles_file=roles,
        audit_log=audit_log,
        watch_token=key if tokens_dir is not None else None,
    )
    server = VllmServer(options)
    stopping = threading.Event()

    def on_signal(signum, _frame):  # SIGTERM (Kubernetes) or Ctrl-C: stop the child, then exit
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    try:
        console.print(f"base {base} ({server.base_fingerprint}); starting vLLM on {options.url} ...", highlight=False)
        if server.wait_ready(s.ready_timeout_s, cancel=stopping):
            console.print(f"[bold]ready[/]: {options.url}/v1  (probes: /health, /vlrl/ready)", highlight=False)
            for spec in specs:
                console.print(f"  {spec.name} -> {spec.internal_name}  ({spec.path})", highlight=False)
        last_check = time.monotonic()
        while not stopping.is_set() and server.process.poll() is None:
            stopping.wait(1.0)
            if watch and time.monotonic() - last_check >= watch:
                last_check = time.monotonic()
                watched = _follow_registry(options.url, key, watched, config, registry_uri)
    finally:
        code = server.stop()
    if not stopping.is_set():
        raise VlrlError(f"the vLLM server exited on its own with status {code}")


def _follow_registry(
    url: str, api_key: str, watched: list[tuple[str, str, str]], config: Path | None, registry_uri: str | None
) -> list[tuple[str, str, str]]:
    """Swap every watched NAME@ALIAS whose version changed since the last check."""
    from vlrl.serve.from_registry import registry_adapter
    from vlrl.serve.swap import ServeClient, swap_to

    updated = []
    for ref, name, version in watched:
        try:
            spec, now = registry_adapter(ref, config, registry_uri)
            if now != version:
                result = swap_to(ServeClient(url, api_key), spec)
                console.print(
                    f"{ref}: version {version} -> {now}; {name} now routes to {result.target} ({result.seconds:.2f} s)",
                    highlight=False,
                )
                version = now
        except VlrlError as exc:  # keep serving what we have; say why the swap did not happen
            console.print(f"[red]{ref}: swap skipped: {exc}[/]", highlight=False)
        updated.append((ref, name, version))
    return updated


def play(
    url: str = typer.Option(..., "--url", help="The server, e.g. http://127.0.0.1:8000 (or .../v1)."),
    model: str = typer.Option(
        ...,
        "--model",
        help="Model name to play: a public adapter name (see `vlrl endpoint status`), a version NAME:TAG, or the base.",
    ),
    split: str = typer.Option("holdout", "--split", help="holdout | adversarial | train."),
    n: int | None = typer.Option(None, "-n", help="Number of tasks (default: the whole split)."),
    api_key: str | None = typer.Option(None, "--api-key", help=API_KEY_HELP),
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="Run config for env/rollout settings: use the one the adapter was trained and evaluated with.",
    ),
    sampled: bool = typer.Option(False, "--sampled", help="Sample at rollout.temperature instead of greedy decoding."),
    concurrency: int = typer.Option(8, "--concurrency", help="Episodes played at once."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write summary.json and traces.jsonl here."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides of the run config."),
) -> None:
    """Play episodes of the config's env against a served model (openai client, images as data URLs) and print the
    same table as `vlrl eval`.

    Example: vlrl play --url http://127.0.0.1:8000 --model maze -c configs/demo-cpu.yaml --split holdout -n 200
    """
    from vlrl.config import load_config
    from vlrl.envs.base import build_split
    from vlrl.eval.evaluate import results_table
    from vlrl.eval.protocol import check_disjoint_from_train
    from vlrl.serve.play import play_episodes

    key = resolve_api_key(api_key)
    cfg = load_config(config, list(overrides or []))
    if split not in ("train", "holdout", "adversarial"):
        raise VlrlError(f"unknown split '{split}': use holdout, adversarial or train")
    all_tasks = build_split(cfg.env, split)
    tasks = [all_tasks[i] for i in range(min(n or len(all_tasks), len(all_tasks)))]
    if split != "train":
        check_disjoint_from_train(cfg, tasks)
    result = play_episodes(url, key, model, cfg, tasks, greedy=not sampled, concurrency=concurrency)
    if out is not None:
        result.save(out)
    console.print(results_table([result], title=f"{split} split, served by {url}"))


@endpoint_app.command("status")
def endpoint_status(
    url: str = typer.Option(..., "--url", help="The server, e.g. http://127.0.0.1:8000."),
    api_key: str | None = typer.Option(None, "--api-key", help=API_KEY_HELP),
    api_key_file: Path | None = KEY_FILE,
) -> None:
    """Routes (public name -> version), loaded versions and requests in flight.

    Example: vlrl endpoint status --url http://127.0.0.1:8000
    """
    from vlrl.serve.swap import ServeClient

    state = ServeClient(url, resolve_api_key(api_key, api_key_file)).state()
    console.print(f"base {state['base_fingerprint']}", highlight=False)
    for name, target in sorted(state["routes"].items()):
        history = " <- ".join(reversed(state["history"].get(name, [])[:-1])) or "-"
        console.print(f"  {name} -> {target}   (before: {history})", highlight=False)
    for internal, path in sorted(state["adapters"].items()):
        console.print(f"  loaded {internal}: {path}  in flight: {state['inflight'].get(internal, 0)}", highlight=False)


@endpoint_app.command("swap")
def endpoint_swap(
    url: str = typer.Option(..., "--url", help="The server, e.g. http://127.0.0.1:8000."),
    name: str = typer.Option(..., "--name", help="Public name to move (e.g. maze-production)."),
    adapter: Path | None = typer.Option(
        None, "--adapter", help="Adapter directory of the new version (readable by the server at this path)."
    ),
    registry: str | None = typer.Option(
        None, "--registry", help="Or NAME@ALIAS: the version the registry alias points to now."
    ),
    registry_uri: str | None = typer.Option(
        None, "--registry-uri", help="Model registry (MLflow URI or .db path); default: the config's."
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Run config whose `registry` section locates the registry."
    ),
    api_key: str | None = typer.Option(None, "--api-key", help=API_KEY_HELP),
    api_key_file: Path | None = KEY_FILE,
) -> None:
    """Load a new version and route NAME to it (role approver), with no failed request; the old one stays loaded for
    rollback.

    Example: vlrl endpoint swap --url http://127.0.0.1:8000 --name maze --adapter runs/grpo-2/adapter
    """
    from vlrl.serve.adapters import adapter_spec
    from vlrl.serve.swap import ServeClient, swap_to

    if (adapter is None) == (registry is None):
        raise VlrlError("give exactly one of --adapter PATH or --registry NAME@ALIAS")
    if registry:
        from vlrl.serve.from_registry import registry_adapter

        spec, _ = registry_adapter(registry, config, registry_uri)
        spec = adapter_spec(name, spec.path, spec.tag)
    else:
        spec = adapter_spec(name, adapter)
    result = swap_to(ServeClient(url, resolve_api_key(api_key, api_key_file)), spec)
    _print_swap(result)


@endpoint_app.command("rollback")
def endpoint_rollback(
    url: str = typer.Option(..., "--url", help="The server, e.g. http://127.0.0.1:8000."),
    name: str = typer.Option(..., "--name", help="Public name to move back."),
    api_key: str | None = typer.Option(None, "--api-key", help=API_KEY_HELP),
    api_key_file: Path | None = KEY_FILE,
) -> None:
    """Route NAME back to the version it served before the current one (role approver).

    Example: vlrl endpoint rollback --url http://127.0.0.1:8000 --name maze
    """
    from vlrl.serve.swap import rollback_adapter

    _print_swap(rollback_adapter(url, resolve_api_key(api_key, api_key_file), name))


def _print_swap(result) -> None:
    loaded = "loaded and " if result.loaded else ""
    retired = f"; unloaded {', '.join(result.unloaded)}" if result.unloaded else ""
    console.print(
        f"{result.name}: {result.previous} -> {result.target} ({loaded}routed in {result.seconds:.2f} s{retired})",
        highlight=False,
    )
    sys.stdout.flush()
