"""`vlrl registry list|show|register|promote|rollback|history`: the adapter registry (docs/registry.md)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import typer
from rich.table import Table

from vlrl.cli.train_cmd import console
from vlrl.config import load_config
from vlrl.errors import VlrlError

app = typer.Typer(no_args_is_help=True, help="Register adapters, promote them through a gate, roll back.")

CONFIG = typer.Option(
    None, "--config", "-c", help="Run config (storage.root, registry.* settings); default: built-in defaults."
)
URI = typer.Option(
    None,
    "--uri",
    help="Registry: an MLflow URI or a path to a .db file (default: registry.uri, else <storage.root>/mlflow.db).",
)
OVERRIDES = typer.Argument(None, help="Dotted overrides, e.g. registry.holdout_margin=0.05.")
REASON = typer.Option(None, "--reason", help="Why: recorded in the audit log.")
IDENTITY = typer.Option(
    None,
    "--identity-file",
    envvar="VLRL_IDENTITY_FILE",
    help="Your token file (mode 600), when registry.access_dir is set: names the identity that acts "
    "(docs/security.md).",
)


def _registry(
    config: Path | None,
    uri: str | None,
    overrides: list[str] | None,
    create: bool = False,
    identity_file: Path | None = None,
):
    from vlrl.tracking.registry import AdapterRegistry

    return AdapterRegistry.from_config(
        load_config(config, list(overrides or [])), uri, create=create, identity_file=identity_file
    )


def _when(ms: int | None) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M") if ms else "-"


@app.command("list")
def list_models(config: Path | None = CONFIG, uri: str | None = URI, overrides: list[str] = OVERRIDES) -> None:
    """Registered models (one per task and base model) and which version holds each stage.

    Example: vlrl registry list -c configs/ci-tiny.yaml
    """
    reg = _registry(config, uri, overrides)
    table = Table(title=f"registered models in {reg.uri}")
    for col in ("model", "base", "versions", "candidate", "staging", "production"):
        table.add_column(col)
    for m in reg.list_models():
        a = m["aliases"]
        table.add_row(
            m["name"],
            (m["base_fingerprint"] or "-")[:19],
            str(m["versions"]),
            *(f"v{a[s]}" if s in a else "-" for s in ("candidate", "staging", "production")),
        )
    console.print(table)


@app.command("show")
def show(
    name: str = typer.Argument(..., help="Registered model name."),
    version: str | None = typer.Argument(None, help="Version number or stage (default: production, else the newest)."),
    config: Path | None = CONFIG,
    uri: str | None = URI,
    as_json: bool = typer.Option(False, "--json", help="Print the version's record as JSON."),
) -> None:
    """A model's versions, and one version's lineage tags, evaluations and gate decisions.

    Example: vlrl registry show maze-3f2a9c0d1b7e production
    """
    reg = _registry(config, uri, None)
    info = reg.show(name, version)
    if as_json:
        console.print_json(json.dumps(info))
        return
    table = Table(title=f"{name}: versions")
    for col in ("version", "stage", "holdout", "adversarial", "registered", "adapter"):
        table.add_column(col)
    for row in reg.versions(name):
        table.add_row(
            f"v{row['version']}", row["stage"], row["holdout"], row["adversarial"], _when(row["created"]), row["source"]
        )
    console.print(table)
    detail = Table(
        title=f"{name} v{info['version']} ({', '.join(info['stages']) or 'no stage'}); adapter files {info['files']}",
        show_header=False,
    )
    detail.add_column("key")
    detail.add_column("value", overflow="fold")
    for key, value in sorted(info["tags"].items()):
        detail.add_row(key, value)
    console.print(detail)


@app.command("register")
def register(
    adapter: Path = typer.Argument(..., help="Adapter directory with vlrl_lineage.json (saved by a tracked run)."),
    eval_dirs: list[Path] = typer.Option(
        [], "--eval", "-e", help="A `vlrl eval -o` folder (holdout, adversarial); repeat."
    ),
    name: str | None = typer.Option(
        None, "--name", help="Registered model (default: registry.model_name, e.g. maze-<base>)."
    ),
    reason: str | None = REASON,
    config: Path | None = CONFIG,
    uri: str | None = URI,
    identity_file: Path | None = IDENTITY,
    overrides: list[str] = OVERRIDES,
) -> None:
    """Register an adapter as a `candidate` version, with its lineage and evaluation summaries as tags.

    The registry database is created on first use. Registering the same adapter again updates its evaluations.

    Example: vlrl registry register runs/grpo/adapter --eval runs/eval-holdout --eval runs/eval-adversarial
    """
    reg = _registry(config, uri, overrides, create=True, identity_file=identity_file)
    out = reg.register(adapter, eval_dirs, name=name, reason=reason)
    evals = (
        ", ".join(f"{s} {e.describe()}" for s, e in out["evals"].items())
        or "none (promotion needs holdout and adversarial)"
    )
    if out["action"] == "register":
        console.print(
            f"{adapter} registered as [bold]{out['name']} v{out['version']}[/] (candidate); evaluations: {evals}",
            highlight=False,
        )
    else:
        console.print(
            f"{adapter} has the same weights as [bold]{out['name']} v{out['version']}[/] ({out['source']}): "
            f"evaluations updated: {evals}",
            highlight=False,
        )


def _gate_table(decision) -> Table:
    table = Table(title=f"gate: {decision.candidate} vs {decision.baseline}")
    for col in ("check", "result", "detail"):
        table.add_column(col)
    for c in decision.checks:
        table.add_row(c.name, "pass" if c.passed else "FAIL", c.detail)
    return table


@app.command("promote")
def promote(
    name: str = typer.Argument(..., help="Registered model name."),
    version: str = typer.Argument(..., help="Version number (or stage alias, e.g. candidate)."),
    to: str | None = typer.Option(None, "--to", help="staging | production (default: the next stage)."),
    reason: str | None = REASON,
    config: Path | None = CONFIG,
    uri: str | None = URI,
    identity_file: Path | None = IDENTITY,
    overrides: list[str] = OVERRIDES,
) -> None:
    """Move a version to staging, or from staging to production, if it passes the promotion gate.

    Gate: same base model; holdout success beats production (or the base model) by registry.holdout_margin and
    McNemar's exact test on the same tasks gives p < registry.max_p_value in the candidate's favour; adversarial
    success drops at most registry.max_adversarial_drop.
    With registry.access_dir: role approver; with registry.two_person_rule: not the identity that registered it.

    Example: vlrl registry promote maze-3f2a9c0d1b7e 3 --to staging --reason "beats v2 on holdout"
    """
    reg = _registry(config, uri, overrides, identity_file=identity_file)
    decision = reg.promote(name, version, to, reason)
    console.print(_gate_table(decision))
    if not decision.passed:
        raise VlrlError(f"promotion of {name} v{version.lstrip('vV')} refused: {decision.reasons()}")
    entry = reg.history(name)[-1]
    console.print(
        f"{name} v{entry['version']} is now in [bold]{entry['to']}[/]"
        + (f" (replacing v{entry['replaces']})" if entry.get("replaces") else ""),
        highlight=False,
    )


@app.command("rollback")
def rollback(
    name: str = typer.Argument(..., help="Registered model name."),
    reason: str | None = REASON,
    config: Path | None = CONFIG,
    uri: str | None = URI,
    identity_file: Path | None = IDENTITY,
    overrides: list[str] = OVERRIDES,
) -> None:
    """Point production back at the previous production version, in one step.

    Example: vlrl registry rollback maze-3f2a9c0d1b7e --reason "regression in serving"
    """
    out = _registry(config, uri, overrides, identity_file=identity_file).rollback(name, reason)
    console.print(f"{name}: production v{out['from']} -> [bold]v{out['to']}[/]", highlight=False)


@app.command("history")
def history(
    name: str = typer.Argument(..., help="Registered model name."),
    config: Path | None = CONFIG,
    uri: str | None = URI,
) -> None:
    """The audit log of a model: registrations, promotions (passed and refused) and rollbacks: who, when, why.

    Example: vlrl registry history maze-3f2a9c0d1b7e
    """
    reg = _registry(config, uri, None)
    table = Table(title=f"{name}: audit log {reg.audit_path}")
    for col in ("time", "who", "action", "version", "stage", "decision", "why", "reason"):
        table.add_column(col, overflow="fold")
    for e in reg.history(name):
        stage = e.get("to") or ("candidate" if e["action"] == "register" else "-")
        who = (
            f"{e['identity']} ({e['role']}) {e['user']}@{e['host']}"
            if e.get("identity")
            else f"{e['user']}@{e['host']}"
        )
        version = f"v{e['version']}" if e.get("version") is not None else "-"
        table.add_row(
            e["time"],
            who,
            e["action"],
            version,
            str(stage),
            e.get("decision", "-"),
            e.get("why") or "-",
            e.get("reason") or "-",
        )
    console.print(table)
