"""Lineage, MLflow tracking and the adapter registry (docs/registry.md).

    lineage.py   what produced a run or an adapter (code, model, data, rewards, config, evals)
    tracker.py   RunTracker: lineage files + an MLflow run (params, per-step metrics, artifacts)
    store.py     tracking/registry URIs (SQLite in storage.root by default), MLflow errors as one line
    gate.py      the promotion gate (pure functions)
    registry.py  AdapterRegistry: register, promote through the gate, roll back, audit log

Nothing here imports MLflow at module import time; the tracker and registry import it on use.
"""

from vlrl.tracking.lineage import (
    ADAPTER_LINEAGE_FILE,
    LINEAGE_FILE,
    collect_lineage,
    finish_lineage,
    read_lineage,
    resolve_lineage,
    write_adapter_lineage,
    write_lineage,
)
from vlrl.tracking.tracker import RunTracker

__all__ = [
    "ADAPTER_LINEAGE_FILE",
    "LINEAGE_FILE",
    "RunTracker",
    "collect_lineage",
    "finish_lineage",
    "read_lineage",
    "resolve_lineage",
    "write_adapter_lineage",
    "write_lineage",
]
