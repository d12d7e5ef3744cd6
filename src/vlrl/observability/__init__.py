"""Observability of a run: Prometheus metrics (`metrics`) and process/GPU resources (`resources`).

See docs/observability.md for the metric reference, the Grafana dashboard and scrape configs.
"""

from __future__ import annotations

__all__ = ["MetricsExporter", "ResourceMonitor", "resource_record", "snapshot"]


def __getattr__(name: str):
    # Lazy: importing vlrl.observability must not need prometheus_client (the `metrics` extra).
    if name == "MetricsExporter":
        from vlrl.observability.metrics import MetricsExporter

        return MetricsExporter
    if name in ("ResourceMonitor", "resource_record", "snapshot"):
        from vlrl.observability import resources

        return getattr(resources, name)
    raise AttributeError(name)
