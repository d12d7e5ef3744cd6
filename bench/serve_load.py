"""Load benchmark of `vlrl serve`: C concurrent clients playing maze turns for D seconds, with a hot
swap of the served adapter in the middle.

Each client plays maze episodes (multi-turn chat, the maze image as a base64 data URL each turn,
greedy) with the official async `openai` client against the adapter's public name, one request at a
time, back to back. Reported: requests, requests/s, latency p50/p95/p99, errors by kind, which
adapter version answered (the response's `model`), and the swap: how long it took, the requests
in flight while the route flipped, and whether any request that started after the flip was answered
by the old version (there should be none).

    # self-contained on CPU: builds the tiny model and two LoRA adapters, starts the server
    python bench/serve_load.py --make-tiny /tmp/serve-bench --clients 32 --duration 30
    # against a running server
    python bench/serve_load.py --url http://127.0.0.1:8000 --api-key KEY --name maze --swap-to /fsx/.../adapter

Run it from the environment that has vLLM (.venv-vllm on CPU) when it starts the server itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Sample:
    start: float  # seconds since the run began
    latency: float
    ok: bool
    served_by: str = ""
    error: str = ""


@dataclass
class SwapRecord:
    start: float = 0.0
    end: float = 0.0
    result: dict = field(default_factory=dict)
    error: str = ""


def make_tiny(out: Path) -> tuple[Path, Path, Path]:
    """The ~0.9M-parameter ci model and two rank-8 LoRA adapters with distinct nonzero weights."""
    import torch

    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.loading import load_policy_model
    from vlrl.models.lora import apply_lora, save_adapter
    from vlrl.models.tiny import build_tiny_model

    base = out / "tiny-ci"
    if not (base / "config.json").is_file():
        build_tiny_model(base, size="ci", seed=0, overwrite=True)
    adapters = []
    for seed in (1, 2):
        path = out / f"adapter-v{seed}"
        if not (path / "adapter_config.json").is_file():
            peft = apply_lora(load_policy_model(base), 8, 16, seed=seed)
            noise = torch.Generator().manual_seed(seed)
            for name, p in peft.named_parameters():
                if "lora_B" in name:  # B = 0 at init would make the adapter a no-op
                    p.data.copy_(0.02 * torch.randn(p.shape, generator=noise))
            save_adapter(peft, path, model_fingerprint(base))
        adapters.append(path)
    return base, adapters[0], adapters[1]


async def client_loop(
    index: int, client, model: str, config, tasks, t0: float, stop_at: float, samples: list[Sample], max_tokens: int
) -> None:
    """Play episodes back to back until `stop_at`; one Sample per request."""
    from vlrl.envs.base import make_env

    episode = index
    while time.perf_counter() < stop_at:
        env = make_env(config.env)
        obs = env.reset(tasks[episode % len(tasks)])
        episode += len(tasks) // 7 + 1
        messages = [
            {"role": "system", "content": env.system_prompt},
            {"role": "user", "content": obs.to_content("data_url")},
        ]
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            try:
                reply = await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=max_tokens, temperature=0.0
                )
            except Exception as exc:  # noqa: BLE001 - every failure is a data point
                samples.append(
                    Sample(
                        start - t0, time.perf_counter() - start, False, error=f"{type(exc).__name__}: {str(exc)[:120]}"
                    )
                )
                break
            samples.append(Sample(start - t0, time.perf_counter() - start, True, served_by=reply.model))
            text = reply.choices[0].message.content or ""
            result = env.step(text)
            if result.done:
                break
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": result.observation.to_content("data_url")},
            ]


async def run_load(url: str, api_key: str, model: str, config, clients: int, duration: float, swap, swap_at: float):
    from openai import AsyncOpenAI

    from vlrl.envs.base import build_split

    tasks = list(build_split(config.env, "train")[i] for i in range(256))
    # No retries: a retried request would hide a failure.
    client = AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key, max_retries=0, timeout=120.0)
    samples: list[Sample] = []
    record = SwapRecord()
    t0 = time.perf_counter()
    stop_at = t0 + duration

    async def do_swap():
        await asyncio.sleep(duration * swap_at)
        record.start = time.perf_counter() - t0
        try:
            result = await asyncio.to_thread(swap)
            record.result = result if isinstance(result, dict) else asdict(result)
        except Exception as exc:  # noqa: BLE001
            record.error = f"{type(exc).__name__}: {exc}"
        record.end = time.perf_counter() - t0

    jobs = [
        client_loop(i, client, model, config, tasks, t0, stop_at, samples, config.rollout.max_new_tokens)
        for i in range(clients)
    ]
    if swap is not None:
        jobs.append(do_swap())
    await asyncio.gather(*jobs)
    elapsed = time.perf_counter() - t0
    await client.close()
    return samples, record, elapsed


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(samples: list[Sample], record: SwapRecord, elapsed: float, clients: int, duration: float) -> dict:
    ok = [s for s in samples if s.ok]
    latencies = [s.latency for s in ok]
    errors: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            errors[s.error] = errors.get(s.error, 0) + 1
    versions: dict[str, int] = {}
    for s in ok:
        versions[s.served_by] = versions.get(s.served_by, 0) + 1
    out = {
        "clients": clients,
        "duration_s": duration,
        "elapsed_s": round(elapsed, 2),
        "requests": len(samples),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "requests_per_s": round(len(ok) / elapsed, 2),
        "latency_s": {
            "mean": round(statistics.fmean(latencies), 4) if latencies else None,
            "p50": round(percentile(latencies, 0.50), 4),
            "p95": round(percentile(latencies, 0.95), 4),
            "p99": round(percentile(latencies, 0.99), 4),
            "max": round(max(latencies, default=float("nan")), 4),
        },
        "served_by": versions,
    }
    if record.start or record.error:
        old, new = record.result.get("previous"), record.result.get("target")
        during = [s for s in samples if s.start < record.end and s.start + s.latency > record.start]
        after = [s for s in ok if s.start > record.end]
        out["swap"] = {
            "at_s": round(record.start, 2),
            "took_s": round(record.end - record.start, 3),
            "error": record.error or None,
            "from": old,
            "to": new,
            "loaded": record.result.get("loaded"),
            "requests_overlapping_swap": len(during),
            "failed_overlapping_swap": sum(not s.ok for s in during),
            "started_after_swap_served_by_old": sum(s.served_by == old for s in after),
            "started_after_swap": len(after),
            "first_new_version_at_s": round(
                min((s.start + s.latency for s in ok if s.served_by == new), default=float("nan")), 3
            ),
        }
    return out


def vllm_only_swap(url: str, api_key: str, first: Path, second: Path, mode: str):
    """For comparison: a name served directly by vLLM (no route), swapped with vLLM's endpoints only.
    Returns (swap function, the name clients use)."""
    from vlrl.serve.swap import ServeClient

    client = ServeClient(url, api_key)
    name = "direct"
    client.load(name, first)

    def swap() -> dict:
        start = time.perf_counter()
        if mode == "unload-load":
            client.unload(name)
            client.load(name, second)
        else:  # vLLM reuses the name's LoRA id: requests in flight continue on the new weights
            client._call(
                "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(second), "load_inplace": True}
            )
        return {"name": name, "target": name, "previous": None, "loaded": True, "seconds": time.perf_counter() - start}

    return swap, name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="A running `vlrl serve` server; default: start one (needs vLLM).")
    parser.add_argument("--api-key", default=os.environ.get("VLRL_API_KEY"))
    parser.add_argument("--name", default="maze", help="Public adapter name to load.")
    parser.add_argument("--make-tiny", type=Path, help="Build the tiny model and two adapters here and serve them.")
    parser.add_argument("--base", type=Path)
    parser.add_argument("--adapter", type=Path, help="The version served at the start.")
    parser.add_argument("--swap-to", type=Path, help="The version swapped in at --swap-at (omit: no swap).")
    parser.add_argument("--swap-at", type=float, default=0.5, help="When to swap, as a fraction of the duration.")
    parser.add_argument(
        "--clients",
        "-C",
        default="32",
        help="Concurrent clients; a comma list (32,128) runs one load "
        "phase per count on the same server, each with a swap (back and forth between the two versions).",
    )
    parser.add_argument("--duration", "-D", type=float, default=30.0)
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument(
        "--config", "-c", type=Path, default=ROOT / "configs" / "ci-tiny.yaml", help="Env and rollout settings."
    )
    parser.add_argument("--json", type=Path, help="Also write the report here.")
    parser.add_argument(
        "--swap-mode",
        choices=("route", "unload-load", "inplace"),
        default="route",
        help="route: vlrl's swap (load the new version, flip the route). For comparison, vLLM's endpoints alone on a "
        "name clients use directly: unload-load (unload it, load the new version under the same name) or "
        "inplace (load_inplace=True under the same name).",
    )
    args = parser.parse_args()

    from vlrl.config import load_config
    from vlrl.serve import ServeOptions, VllmServer, adapter_spec, swap_adapter

    server = None
    if args.make_tiny:
        args.base, args.adapter, made_second = make_tiny(args.make_tiny)
        args.swap_to = args.swap_to or made_second
    overrides = [f"model.path={args.base}"] if args.base else []
    config = load_config(args.config, overrides)
    api_key = args.api_key or "bench-" + os.urandom(8).hex()
    url = args.url
    t = time.perf_counter()
    if url is None:
        if not (args.base and args.adapter):
            parser.error("give --url, or --base and --adapter (or --make-tiny) to start a server")
        options = ServeOptions(
            base=args.base,
            adapters=[adapter_spec(args.name, args.adapter)],
            api_key=api_key,
            port=args.port,
            max_model_len=config.rollout.max_model_len,
            max_images=config.env.max_turns + 2,
        )
        log = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve_load-{args.port}.log"
        server = VllmServer(options, log=log).start()
        try:
            server.wait_ready(900)
        except BaseException:
            server.stop()
            raise
        url = server.url
        print(f"server ready in {time.perf_counter() - t:.1f} s (log {log})", file=sys.stderr)
    counts = [int(c) for c in str(args.clients).split(",") if c.strip()]
    reports = []
    try:
        for phase, clients in enumerate(counts):
            # Each phase swaps once: to --swap-to, then back to --adapter, and so on.
            target = args.swap_to if phase % 2 == 0 else args.adapter
            swap, model = None, args.name
            if target is not None and args.swap_mode == "route":
                swap = lambda target=target: swap_adapter(url, api_key, args.name, target)  # noqa: E731
            elif target is not None:
                old = args.adapter if phase % 2 == 0 else args.swap_to
                swap, model = vllm_only_swap(url, api_key, old, target, args.swap_mode)
            samples, record, elapsed = asyncio.run(
                run_load(url, api_key, model, config, clients, args.duration, swap, args.swap_at)
            )
            report = summarize(samples, record, elapsed, clients, args.duration)
            report["machine"] = {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
            }
            print(json.dumps(report, indent=1))
            reports.append(report)
    finally:
        if server is not None:
            server.stop()
    report = reports[0] if len(reports) == 1 else {"phases": reports, "errors": sum(r["errors"] for r in reports)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if len(reports) > 1:
        return 0 if report["errors"] == 0 and not any((r.get("swap") or {}).get("error") for r in reports) else 1
    return 0 if report["errors"] == 0 and not (report.get("swap") or {}).get("error") else 1


if __name__ == "__main__":
    sys.exit(main())
