"""`vlrl eval` (the evaluation protocol: base vs adapters on one split) and `vlrl eval-verify`."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from vlrl.cli.train_cmd import console
from vlrl.config import load_config
from vlrl.errors import VlrlError


def register(app: typer.Typer) -> None:
    app.command("eval")(evaluate)
    app.command("eval-verify")(verify)


def evaluate(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Run config for env/rollout settings (default: built-in defaults)."
    ),
    model: Path | None = typer.Option(
        None, "--model", help="Base model directory (default: model.path of the config)."
    ),
    adapter: list[Path] = typer.Option([], "--adapter", "-a", help="Adapter directory; repeat to compare several."),
    split: str = typer.Option("holdout", "--split", help="holdout | adversarial | train."),
    n: int | None = typer.Option(None, "-n", help="Number of tasks (default: the whole split)."),
    decoding: str = typer.Option("greedy", "--decoding", help="greedy | sampled (at rollout.temperature) | both."),
    sampled: bool = typer.Option(False, "--sampled", help="Same as --decoding sampled."),
    no_base: bool = typer.Option(False, "--no-base", help="Leave the bare base model out of the table."),
    force: bool = typer.Option(False, "--force", help="Evaluate even on the split an adapter was trained on."),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Where summary.json and traces.jsonl per model go (default: STORAGE_ROOT/eval-SPLIT-TIME).",
    ),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides."),
) -> None:
    """Evaluate the base model and adapters on a split: success with 95% intervals, turns, invalid rate, per task
    group (the maze: per size), and every two models compared task by task (discordant tasks, paired difference,
    McNemar's exact p).

    Every episode's trace is saved, so `vlrl eval-verify OUT` can re-check the success rates without a model.
    An adapter is refused on the split its lineage says it was trained on (unless --force).

    Example: vlrl eval -c configs/demo-cpu.yaml -a runs/demo/sft-adapter -a runs/demo/grpo/adapter -n 200 -o
    runs/eval-holdout
    """
    from vlrl.eval.evaluate import group_table, paired_table, result_pairs, results_table
    from vlrl.eval.protocol import evaluate_models

    ov = list(overrides or [])
    if model is not None:
        ov.append(f"model.path={model}")
    cfg = load_config(config, ov)
    if sampled:
        decoding = "sampled"
    if decoding not in ("greedy", "sampled", "both"):
        raise VlrlError(f"--decoding {decoding!r}: use greedy, sampled or both")
    decodings = ["greedy", "sampled"] if decoding == "both" else [decoding]
    models = [] if no_base else [("base", None, None)]
    models += [(p.parent.name + "/" + p.name, None, str(p)) for p in adapter]
    if not models:
        raise VlrlError("--no-base without any --adapter leaves nothing to evaluate")
    out = out or Path(cfg.storage.root) / time.strftime(f"eval-{split}-%Y%m%d-%H%M%S")
    results = evaluate_models(cfg, models, split=split, limit=n, decodings=decodings, out_dir=out, force=force)
    s = results[0].summary()
    console.print(
        results_table(
            results, title=f"{split} split ({s['n']} tasks, split {s['split_version']}, tasks {s['tasks_hash'][:8]})"
        )
    )
    console.print(group_table(results))
    if result_pairs(results):
        console.print(paired_table(results))
    console.print(f"summaries and traces in [bold]{out}[/] (re-check with: vlrl eval-verify {out})", highlight=False)


def verify(
    path: Path = typer.Argument(
        ..., help="A `vlrl eval --out` folder, or one traces.jsonl (gzipped ones too: traces.jsonl.gz)."
    ),
) -> None:
    """Replay saved evaluation traces through the environment and re-count successes, without a model.

    Exits with status 1 when a trace does not replay as recorded, a count differs from summary.json,
    or an evaluated task is a training task (for the maze: shows a training wall layout).

    Example: vlrl eval-verify runs/eval-holdout
    """
    from vlrl.eval.stats import Proportion
    from vlrl.eval.verify import verify_eval_dir

    reports = verify_eval_dir(path)
    table = Table(title=f"re-verified from traces: {path}")
    for col in (
        "traces",
        "n",
        "success (replayed) [95% CI]",
        "summary says",
        "mismatched traces",
        "training tasks",
        "ok",
    ):
        table.add_column(col)
    for r in reports:
        table.add_row(
            str(Path(r.traces_file).parent.name),
            str(r.n),
            Proportion(r.successes_replayed, r.n).format(),
            "-" if r.successes_recorded is None else str(r.successes_recorded),
            str(len(r.mismatched)),
            str(len(r.in_train_split)),
            "yes" if r.ok else "NO",
        )
    console.print(table)
    if not all(r.ok for r in reports):
        raise typer.Exit(1)
