"""Where a training run's records go besides RUN_DIR/metrics.jsonl.

Two consumers, both optional, both fed by the trainer at the same moments (a step's record, an
evaluation, a stability guard's event, the end of the run):

- the Prometheus exporter (`vlrl.observability.metrics`, on when `tracking.exporter_port` is set),
  which Grafana reads live;
- the run tracker (`vlrl.tracking.tracker`): the lineage manifest (RUN_DIR/lineage.json and the
  adapter's copy, always written) and, with `tracking.enabled`, the MLflow run.

Kept out of the trainer so that the loop reads as GRPO, not as bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlrl.config import RunConfig


class RunTelemetry:
    """The exporter and the tracker of one run; every method is safe to call when either is off."""

    def __init__(self, config: RunConfig, run_dir: Path, init_adapter: str | None = None):
        from vlrl.tracking.tracker import RunTracker

        self.config, self.run_dir, self.init_adapter = config, Path(run_dir), init_adapter
        self.exporter = None
        if config.tracking.exporter_port is not None:
            from vlrl.observability.metrics import MetricsExporter

            # Started before the workers: a port already in use is an error before any compute.
            self.exporter = MetricsExporter(config, self.run_dir.name)
        self.tracker = RunTracker.from_config(config)
        self.started = False

    def start(self, resumed: bool) -> None:
        """Write the run's lineage and open (or, after a resume, continue) its MLflow run."""
        from vlrl.tracking.lineage import collect_lineage

        lineage = collect_lineage(self.config, self.run_dir, init_adapter=self.init_adapter, resumed=resumed)
        self.tracker.start(self.config, self.run_dir, lineage)
        self.started = True

    def step(self, record: dict[str, Any], resources: Callable[[], dict[str, float]] | None = None) -> None:
        """One step's record (the metrics.jsonl line). `resources` reads the workers' memory and
        GPU use: exported live, but kept out of the record, which must replay identically."""
        if self.exporter is not None:
            self.exporter.publish({**record, **(resources() if resources else {})})
        if self.started:
            self.tracker.log_step(int(record["step"]), record)

    def evaluation(self, step: int, summary: dict[str, Any], metrics: dict[str, float]) -> None:
        """A holdout evaluation: its summary to the tracker, its metrics to the exporter."""
        if self.exporter is not None:
            self.exporter.publish({"step": step, **metrics})
        if self.started:
            self.tracker.log_eval(step, summary)

    def guard_event(self, event: dict[str, Any]) -> None:
        """A stability guard fired (`GuardEvent.as_dict()`): a tag on the MLflow run. The exporter
        counts it from the step's record (`guard/<check>/<action>` keys)."""
        if self.started:
            self.tracker.log_guard_event(event)

    def finish(self, status: str, adapter_dir: str | Path | None = None) -> None:
        """Close the lineage (checkpoints, evaluations, adapter) and the MLflow run."""
        if self.started:
            self.tracker.end(status, adapter_dir)
            self.started = False

    def close(self) -> None:
        """Stop serving metrics (the port is free again)."""
        if self.exporter is not None:
            self.exporter.close()
