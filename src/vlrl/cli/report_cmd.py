"""`vlrl report`: the HTML report of a run directory (finished or still running)."""

from __future__ import annotations

from pathlib import Path

import typer

from vlrl.cli.train_cmd import console


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    run_dir: Path = typer.Argument(..., help="The run directory (holds metrics.jsonl, config.yaml, ...)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="HTML file to write (default: RUN_DIR/report.html)."),
) -> None:
    """Write a self-contained HTML report of a run: learning curves with holdout evaluations and their
    95% intervals, where the time goes per step, throughput, evaluations, config and lineage.
    The plots are also written as PNG files next to the page.

    Example: vlrl report runs/demo/grpo --out /tmp/demo-report.html
    """
    from vlrl.report.html import write_report

    path = write_report(run_dir, out)
    console.print(f"report written to [bold]{path}[/] (plots: {path.stem}-*.png beside it)")
