"""`RunTracker`: a training run's lineage files and, when tracking is on, its MLflow run.

Wiring it into a trainer takes five calls:

    tracker = RunTracker.from_config(config)                          # setup
    tracker.start(config, run_dir, collect_lineage(config, run_dir, init_adapter=...))
    tracker.log_step(step, record)                                    # after each step's metrics line
    tracker.log_eval(step, result.summary())                          # after each evaluation
    tracker.end("FINISHED", adapter_dir)                              # after the adapter is saved
                                                                      # (or end("FAILED") on an error)

Lineage is written whether or not MLflow is on (RUN_DIR/lineage.json at start and end, and the
adapter's vlrl_lineage.json); with `tracking.enabled=false` every MLflow call is a no-op.

MLflow contents: params = the resolved config flattened to dotted keys (lists as JSON, values cut
to MLflow's 6000 characters), tags = the lineage's identity (commit, dirty, base fingerprint,
config hash, image, split versions; `vlrl.guard.<check>` for a stability guard's latest event), metrics = every numeric
value of each step record and each
evaluation summary (names sanitized to MLflow's alphabet; NaN/inf skipped), artifacts =
lineage.json at start and end, and at the end config.yaml, metrics.jsonl, evals.json, code.diff
and the adapter (`tracking.log_artifacts`).

Logging during training never stops the run: a failed `log_step`/`log_eval` is reported once as a
warning and training goes on. A failure in `start` (wrong URI, locked database) is a VlrlError,
before any compute is spent.
"""

from __future__ import annotations

import json
import math
import re
import time
import warnings
from pathlib import Path
from typing import Any

from vlrl.config import RunConfig, config_to_yaml
from vlrl.errors import VlrlError
from vlrl.tracking.lineage import finish_lineage, write_lineage
from vlrl.tracking.store import check_sqlite, default_artifact_location, mlflow_client, mlflow_errors, tracking_uri

MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
MAX_KEY = 250  # MAX_ENTITY_KEY_LENGTH
STATUSES = {"FINISHED", "FAILED", "KILLED"}
_BAD_METRIC_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


def flatten_params(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1, "c": [1, 2]}} -> {"a.b": "1", "a.c": "[1, 2]"}, values cut to MLflow's limit."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_params(value, name + "."))
            continue
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > MAX_PARAM_VALUE:
            text = text[: MAX_PARAM_VALUE - 3] + "..."
        out[name[:MAX_KEY]] = text
    return out


def metric_name(name: str) -> str:
    """A metric name MLflow accepts: letters, digits, `_ - . / space`; others become `_`."""
    return _BAD_METRIC_CHARS.sub("_", str(name))[:MAX_KEY] or "_"


def numeric_metrics(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a (possibly nested) record, as {sanitized dotted/slashed name: value}."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(numeric_metrics(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[metric_name(f"{prefix}{key}")] = float(value)
        elif isinstance(value, bool):
            out[metric_name(f"{prefix}{key}")] = float(value)
    return out


def lineage_tags(lineage: dict[str, Any]) -> dict[str, str]:
    """The lineage's identity as short `vlrl.*` tags, searchable in MLflow."""
    code, git = lineage.get("code", {}), lineage.get("code", {}).get("git", {})
    tags = {
        "vlrl.kind": lineage.get("run", {}).get("kind"),
        "vlrl.run_dir": lineage.get("run", {}).get("dir"),
        "vlrl.version": code.get("vlrl_version"),
        "vlrl.git_commit": git.get("commit"),
        "vlrl.git_dirty": str(git.get("dirty")) if "dirty" in git else None,
        "vlrl.git_diff_sha256": git.get("diff_sha256"),
        "vlrl.image": code.get("image"),
        "vlrl.base_model": lineage.get("model", {}).get("path"),
        "vlrl.base_fingerprint": lineage.get("model", {}).get("fingerprint"),
        "vlrl.config_hash": lineage.get("config_hash"),
        "vlrl.reward_hash": lineage.get("rewards", {}).get("hash"),
        "vlrl.env": lineage.get("data", {}).get("env"),
        "mlflow.source.git.commit": git.get("commit"),
    }
    for split, info in lineage.get("data", {}).get("splits", {}).items():
        tags[f"vlrl.split.{split}"] = f"{info.get('version')} seeds [{info.get('seed_start')},{info.get('seed_end')})"
    return {k: str(v) for k, v in tags.items() if v is not None}


class RunTracker:
    """Lineage files always; an MLflow run when `uri` is given (see the module docstring)."""

    def __init__(self, uri: str | None, experiment: str = "vlrl", log_artifacts: bool = True):
        self.uri = uri
        self.experiment = experiment
        self.log_artifacts_at_end = log_artifacts
        self.client = None
        self.run_id: str | None = None
        self.run_dir: Path | None = None
        self.lineage: dict[str, Any] | None = None
        self.ended = False
        self._warned = False

    @classmethod
    def from_config(cls, config: RunConfig) -> RunTracker:
        """A tracker for `config`: MLflow at `tracking_uri(config)` when `tracking.enabled`, else lineage only."""
        t = config.tracking
        return cls(tracking_uri(config) if t.enabled else None, t.experiment, t.log_artifacts)

    @property
    def enabled(self) -> bool:
        """True when this tracker logs to MLflow."""
        return self.uri is not None

    # -- start -----------------------------------------------------------------------------
    def start(self, config: RunConfig, run_dir: str | Path, lineage: dict[str, Any]) -> str | None:
        """Write RUN_DIR/lineage.json and open (or, for a resumed run, reopen) the MLflow run.

        Returns the MLflow run id (None without tracking); the lineage gains a `tracking` section.
        """
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lineage = lineage
        if not self.enabled:
            write_lineage(self.run_dir, lineage)
            return None
        check_sqlite(self.uri, must_exist=False, what="MLflow tracking database")
        self.client = mlflow_client(self.uri)
        what = f"starting the MLflow run in {self.uri}"
        with mlflow_errors(what):
            experiment = self.client.get_experiment_by_name(self.experiment)
            if experiment is None:
                experiment_id = self.client.create_experiment(
                    self.experiment, artifact_location=default_artifact_location(self.uri)
                )
            else:
                experiment_id = experiment.experiment_id
            previous = lineage.get("tracking", {})
            resumed = (
                previous.get("uri") == self.uri and previous.get("run_id") and self._run_exists(previous["run_id"])
            )
            if resumed:
                self.run_id = previous["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                run = self.client.create_run(experiment_id, run_name=self.run_dir.name, tags=lineage_tags(lineage))
                self.run_id = run.info.run_id
                self._log_params(flatten_params(config.model_dump(mode="json")))
        lineage["tracking"] = {
            "uri": self.uri,
            "experiment": self.experiment,
            "experiment_id": experiment_id,
            "run_id": self.run_id,
        }
        write_lineage(self.run_dir, lineage)
        with mlflow_errors(what):
            self.client.log_dict(self.run_id, lineage, "lineage/lineage-start.json")
            if resumed:
                self.client.log_text(self.run_id, config_to_yaml(config), f"config-resumed-{int(time.time())}.yaml")
        return self.run_id

    def _run_exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
            return True
        except MlflowException:
            return False

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MAX_PARAMS_TAGS_PER_BATCH
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    # -- during the run --------------------------------------------------------------------
    def _log_metrics(self, values: dict[str, float], step: int) -> None:
        if not self.enabled or self.run_id is None or not values:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, int(step)) for k, v in values.items()]
        try:
            with mlflow_errors("logging metrics to MLflow"):
                for i in range(0, len(metrics), 1000):
                    self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        except VlrlError as exc:
            self._warn(exc)

    def _warn(self, exc: Exception) -> None:
        if not self._warned:
            warnings.warn(f"MLflow logging failed, training goes on ({exc})", RuntimeWarning, stacklevel=3)
            self._warned = True

    def log_step(self, step: int, record: dict[str, Any]) -> None:
        """One training step's record (the metrics.jsonl line): every finite number as a metric."""
        self._log_metrics(numeric_metrics({k: v for k, v in record.items() if k != "step"}), step)

    def log_eval(self, step: int, summary: dict[str, Any]) -> None:
        """An evaluation summary (`EvalResult.summary()`) as `eval/<split>/...` metrics and a JSON artifact."""
        split = summary.get("split", "eval")
        keep = {k: v for k, v in summary.items() if k not in ("step", "by_group", "by_size", "model", "n_by_size")}
        self._log_metrics(numeric_metrics(keep, f"eval/{split}/"), step)
        if self.enabled and self.run_id is not None:
            try:
                with mlflow_errors("logging an evaluation to MLflow"):
                    self.client.log_dict(self.run_id, summary, f"evals/{split}-step-{int(step):06d}.json")
            except VlrlError as exc:
                self._warn(exc)

    def log_guard_event(self, event: dict[str, Any]) -> None:
        """A stability guard's event as the tag `vlrl.guard.<check>` = "<action> at step N: <values>"
        (the latest per check; the step record's `guard/<check>/<action>` metric counts them all)."""
        if not self.enabled or self.run_id is None:
            return
        text = f"{event['action']} at step {event['step']}: {event['message']}"
        try:
            with mlflow_errors("logging a guard event to MLflow"):
                self.client.set_tag(self.run_id, f"vlrl.guard.{event['check']}", text[:MAX_PARAM_VALUE])
        except VlrlError as exc:
            self._warn(exc)

    def log_artifacts(self, paths: list[str | Path], artifact_path: str | None = None) -> None:
        """Copy files or directories (each under its own name) into the run's artifacts."""
        if not self.enabled or self.run_id is None:
            return
        with mlflow_errors("logging artifacts to MLflow"):
            for path in map(Path, paths):
                if path.is_dir():
                    dest = f"{artifact_path}/{path.name}" if artifact_path else path.name
                    self.client.log_artifacts(self.run_id, str(path), dest)
                elif path.is_file():
                    self.client.log_artifact(self.run_id, str(path), artifact_path)

    # -- end -------------------------------------------------------------------------------
    def end(
        self,
        status: str = "FINISHED",
        adapter_dir: str | Path | None = None,
        lineage: dict[str, Any] | None = None,
        evaluations: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Complete the lineage (checkpoints, evaluations, adapter), write it to the run and the
        adapter, log the artifacts and close the MLflow run with `status` (FINISHED, FAILED, KILLED).

        Idempotent: a second call (e.g. from a `finally`) returns the finished lineage unchanged.
        """
        if self.run_dir is None:
            raise VlrlError("RunTracker.end called before start")
        status = status.upper()
        if status not in STATUSES:
            raise VlrlError(f"run status must be one of {', '.join(sorted(STATUSES))}, got {status!r}")
        if self.ended:
            return self.lineage or {}
        self.ended = True
        done = finish_lineage(
            lineage or self.lineage or {}, self.run_dir, status=status, adapter_dir=adapter_dir, evaluations=evaluations
        )
        self.lineage = done
        if not self.enabled or self.run_id is None:
            return done
        try:
            with mlflow_errors("closing the MLflow run"):
                self.client.log_dict(self.run_id, done, "lineage/lineage.json")
                if self.log_artifacts_at_end:
                    files = [self.run_dir / n for n in ("config.yaml", "metrics.jsonl", "evals.json", "code.diff")]
                    self.log_artifacts([f for f in files if f.is_file()], "run")
                    if adapter_dir is not None and Path(adapter_dir).is_dir():
                        self.client.log_artifacts(self.run_id, str(adapter_dir), "adapter")
                for key, value in (done.get("adapter") or {}).items():
                    if key in ("fingerprint", "path"):
                        self.client.set_tag(self.run_id, f"vlrl.adapter_{key}", str(value))
                self.client.set_terminated(self.run_id, status)
        except VlrlError as exc:
            self._warn(exc)
        return done
