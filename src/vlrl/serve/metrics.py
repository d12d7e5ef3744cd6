"""Prometheus metrics of the serving layer, served by the routing middleware at GET /vlrl/metrics.

    vlrl_serve_requests_total{model, status}     requests answered, by public model name and HTTP status
    vlrl_serve_request_seconds{model}            request latency (histogram: _bucket, _sum, _count),
                                                 from the first byte in to the last byte out
    vlrl_serve_route_info{name, target}          1 per route: which version a public name serves now

`model` is the public name a request asked for when it is a route, the internal version name
(`NAME:TAG`) when it asked for one directly, else "-" (the base model, listings, admin calls):
the label's values stay bounded by what the server serves, whatever clients send. The probes and
the metrics path itself are not counted. The alert rules in deploy/prometheus/alerts.yml use the
first two (error rate, p95 latency). vLLM's own engine metrics stay on its /metrics.

Its own CollectorRegistry, like the training exporter: nothing from other libraries leaks in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Upper bounds in seconds: a 1-token probe takes tens of ms, a multi-turn maze answer a few
# seconds, a long generation under load a minute or more.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _RouteCollector(Collector):
    def __init__(self, routes: Callable[[], dict[str, str]]):
        self.routes = routes

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "vlrl_serve_route_info", "Always 1: the version each public name routes to.", labels=["name", "target"]
        )
        for name, target in sorted(self.routes().items()):
            family.add_metric([name, target], 1.0)
        yield family


class ServeMetrics:
    """The counters and histogram of one server process, plus the live route table."""

    def __init__(self, routes: Callable[[], dict[str, str]]):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "vlrl_serve_requests",
            "Requests answered, by model and HTTP status.",
            ["model", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "vlrl_serve_request_seconds",
            "Seconds from the request's arrival to the last byte of the answer.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_RouteCollector(routes))

    def observe(self, model: str, status: int, seconds: float) -> None:
        """One answered request."""
        self.requests.labels(model=model, status=str(status)).inc()
        self.latency.labels(model=model).observe(seconds)

    def render(self) -> bytes:
        """The exposition text a scrape gets."""
        return generate_latest(self.registry)
