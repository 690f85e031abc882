"""Prometheus metrics: one registry per app (tests run many apps in one process).

Each server builds one :class:`Metrics` before anything else and hands it to whatever declares
metrics on it: the app factory (:func:`gym_services.server.app.create_server_app`) declares the
control plane's (:class:`gym_services.control.metrics.ControlMetrics`), and each server declares
its own in a small dataclass built with :meth:`Metrics.counter` and friends, which its routes
and participant then receive in their constructors. Nothing reaches metrics any other way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response


class _LiveCollector:
    """Exports a participant's ``live()`` counts as gauges at scrape time."""

    def __init__(self, server: str, read: Callable[[], dict[str, Any]]) -> None:
        self.server = server
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("gym_live", "Live state held by this server, by kind", labels=["server", "kind"])
        for kind, value in self.read().items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                family.add_metric([self.server, kind], float(value))
        yield family


class Metrics:
    """The registry one server's metrics are declared on, and its ``/metrics`` endpoint."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.registry = CollectorRegistry(auto_describe=True)

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, list(labels), registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, list(labels), registry=self.registry)

    def histogram(self, name: str, doc: str, labels: Sequence[str] = (), *, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, doc, list(labels), buckets=tuple(buckets), registry=self.registry)

    def track_live(self, read: Callable[[], dict[str, Any]]) -> None:
        """Export ``read()``'s numbers as ``gym_live{kind=...}`` at every scrape."""
        self.registry.register(_LiveCollector(self.server, read))

    def counter_totals(self) -> dict[str, float]:
        """Every counter's samples, ``name{label=value,...}`` -> value: what a server logs as it exits."""
        totals: dict[str, float] = {}
        for family in self.registry.collect():
            if family.type != "counter":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                    totals[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return totals

    async def endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
