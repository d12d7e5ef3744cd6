"""`vlrl lineage ADAPTER_OR_RUN`: the chain adapter -> run -> config / model / data / code -> evaluations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.tree import Tree

from vlrl.cli.train_cmd import console
from vlrl.config import load_config


def register(app: typer.Typer) -> None:
    app.command("lineage")(lineage)


def _short(h: str | None, n: int = 19) -> str:
    return (h or "-")[:n]


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "?"


def _eval_line(e: dict[str, Any]) -> str:
    where = f"step {e['step']} " if "step" in e else ""
    lo, hi = e.get("success_low", 0.0), e.get("success_high", 1.0)
    return (
        f"{where}{e.get('split', '?')} {e.get('decoding', '')}: success {100 * e.get('success_rate', 0):.1f}% "
        f"[{100 * lo:.1f}, {100 * hi:.1f}] of {e.get('n', '?')}"
    )


def _run_tree(node: Tree, chain: dict[str, Any]) -> None:
    lin = chain["lineage"]
    run, code, git = lin.get("run", {}), lin.get("code", {}), lin.get("code", {}).get("git", {})
    track = lin.get("tracking", {})
    r = node.add(
        f"[bold]run[/] {run.get('dir')} ({run.get('kind')}, {lin.get('status')}, "
        f"{run.get('started_at')} -> {run.get('ended_at', '...')}, by {run.get('user')}@{run.get('host')})"
    )
    if track:
        r.add(f"mlflow run {track.get('run_id')} in {track.get('uri')} (experiment {track.get('experiment')})")
    r.add(f"lineage read from {chain['source']}")
    dirty = ""
    if "dirty" in git:
        dirty = f", {'DIRTY (diff ' + _short(git.get('diff_sha256')) + ')' if git['dirty'] else 'clean'}"
    c = r.add(
        f"[bold]code[/] vlrl {code.get('vlrl_version')}, git {git.get('commit', 'unknown')[:12]}{dirty}, "
        f"image {code.get('image', '-')}"
    )
    env = lin.get("environment", {})
    libs = ", ".join(f"{k} {v}" for k, v in env.get("libraries", {}).items())
    c.add(f"python {env.get('python')}; {libs}")
    hw = lin.get("hardware", {})
    gpus = ", ".join(hw.get("gpus", [])) or "no GPU"
    ray = hw.get("ray_cluster")
    c.add(
        f"hardware {hw.get('cpu_count')} CPUs, {_gib(hw.get('memory_bytes'))}, {gpus}"
        + (f"; Ray cluster {ray['nodes']} nodes, {ray['GPU']:g} GPUs {' '.join(ray['accelerators'])}" if ray else "")
    )
    r.add(f"[bold]config[/] {_short(lin.get('config_hash'))} ({Path(run.get('dir', '.')) / 'config.yaml'})")
    model = lin.get("model", {})
    m = r.add(f"[bold]model[/] {model.get('path')} {_short(model.get('fingerprint'))}")
    if model.get("sft_record"):
        m.add(
            f"full SFT of {model['sft_record'].get('trained_from')} "
            f"({_short(model['sft_record'].get('base_fingerprint'))})"
        )
    if model.get("vision_pretrain_record"):
        vp = model["vision_pretrain_record"]
        seen = vp.get("final", {}).get("agent_exact")
        m.add(
            f"vision tower pretrained on square labels ({vp.get('steps')} steps"
            + (f", holdout agent squares {seen:.1%} exact" if seen is not None else "")
            + f") from {vp.get('trained_from')} ({_short(vp.get('base_fingerprint'))})"
        )
    init = model.get("init_adapter")
    if init:
        i = m.add(f"[bold]started from adapter[/] {init.get('path')} {_short(init.get('fingerprint'))}")
        if chain.get("parent"):
            _chain_tree(i, chain["parent"])
    data = lin.get("data", {})
    env_facts = "".join(
        f", {k.replace('_', ' ')} {v}" for k, v in data.items() if k not in ("env", "generator_version", "splits")
    )
    d = r.add(f"[bold]data[/] env {data.get('env')}, generator {data.get('generator_version')}{env_facts}")
    for name, s in data.get("splits", {}).items():
        split_facts = "".join(
            f", {k} {v}" for k, v in s.items() if k not in ("seed_start", "seed_end", "count", "version")
        )
        d.add(
            f"{name}: seeds [{s['seed_start']}, {s['seed_end']}), {s['count']} tasks{split_facts}, version "
            f"{s['version']}"
        )
    rw = lin.get("rewards", {})
    settings = ", ".join(f"{k} {json.dumps(v)}" for k, v in rw.items() if k not in ("env", "hash"))
    r.add(f"[bold]rewards[/] {_short(rw.get('hash'))} {settings}")
    ckpts = lin.get("checkpoints", [])
    r.add(f"[bold]checkpoints[/] {', '.join(Path(c['path']).name for c in ckpts) or 'none'}")
    ev = r.add(f"[bold]evaluations[/] {len(lin.get('evaluations', []))}")
    for e in lin.get("evaluations", [])[-5:]:
        ev.add(_eval_line(e))


def _chain_tree(node: Tree, chain: dict[str, Any]) -> None:
    adapter = chain.get("adapter")
    if adapter:
        a = node.add(
            f"[bold]adapter[/] {adapter.get('path')} {_short(adapter.get('recorded_fingerprint'))}"
            + (f" (files {adapter['files']})" if "files" in adapter else "")
        )
        _run_tree(a, chain)
    else:
        _run_tree(node, chain)


def _resolve_registry_ref(ref: str, config: Path | None, uri: str | None) -> Path:
    """models:/NAME/VERSION or models:/NAME@STAGE -> the registered adapter directory."""
    from vlrl.errors import VlrlError
    from vlrl.tracking.registry import AdapterRegistry

    body = ref[len("models:/") :]
    name, _, version = body.partition("@") if "@" in body else body.partition("/")
    if not name or not version:
        raise VlrlError(f"{ref}: use models:/NAME/VERSION or models:/NAME@STAGE")
    info = AdapterRegistry.from_config(load_config(config, []), uri).show(name, version)
    return Path(info["source"])


def lineage(
    path: str = typer.Argument(..., help="Adapter directory, run directory, lineage file, or models:/NAME@STAGE."),
    as_json: bool = typer.Option(False, "--json", help="Print the resolved chain as JSON."),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Config naming the registry (for models:/ references)."
    ),
    uri: str | None = typer.Option(None, "--uri", help="Registry URI or .db path (for models:/ references)."),
) -> None:
    """Trace an adapter or run: adapter -> run -> code, config, model, data, rewards -> checkpoints and evaluations.

    Example: vlrl lineage runs/grpo-20261129-120000/adapter
    """
    from vlrl.tracking.lineage import resolve_lineage

    target = _resolve_registry_ref(path, config, uri) if path.startswith("models:/") else Path(path)
    chain = resolve_lineage(target)
    if as_json:
        console.print_json(json.dumps(chain, default=str))
        return
    tree = Tree(f"lineage of [bold]{path}[/]")
    _chain_tree(tree, chain)
    console.print(tree)
