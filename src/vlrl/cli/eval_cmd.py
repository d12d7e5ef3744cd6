"""`vlrl eval`: the evaluation protocol on the command line (base vs adapters on one split)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vlrl.cli.train_cmd import console
from vlrl.config import load_config


def register(app: typer.Typer) -> None:
    app.command("eval")(evaluate)


def evaluate(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="Run config for env/rollout settings (default: built-in defaults)."),
    model: Optional[Path] = typer.Option(None, "--model", help="Base model directory (default: model.path of the config)."),
    adapter: list[Path] = typer.Option([], "--adapter", "-a", help="Adapter directory; repeat to compare several."),
    split: str = typer.Option("holdout", "--split", help="holdout | adversarial | train."),
    n: Optional[int] = typer.Option(None, "-n", help="Number of tasks (default: the whole split)."),
    sampled: bool = typer.Option(False, "--sampled", help="Sample at rollout.temperature instead of greedy decoding."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write summary.json and traces.jsonl per model here."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides."),
) -> None:
    """Evaluate the base model and adapters on a split: success with 95% intervals, turns, invalid rate.

    Example: vlrl eval -c configs/demo-cpu.yaml -a runs/demo/sft-adapter -a runs/demo/grpo/adapter -n 200
    """
    from vlrl.eval.protocol import evaluate_models

    ov = list(overrides or [])
    if model is not None:
        ov.append(f"model.path={model}")
    cfg = load_config(config, ov)
    models = [("base", None, None)] + [(p.parent.name + "/" + p.name, None, str(p)) for p in adapter]
    results = evaluate_models(cfg, models, split=split, limit=n, greedy=not sampled, out_dir=out)
    from vlrl.eval.evaluate import results_table

    console.print(results_table(results, title=f"{split} split"))
