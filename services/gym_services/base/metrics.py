"""Prometheus metrics, one registry per app (tests run many apps in one process)."""

from __future__ import annotations

from collections.abc import Callable
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

    def collect(self):
        family = GaugeMetricFamily("gym_live", "Live state held by this server, by kind", labels=["server", "kind"])
        for kind, value in self.read().items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                family.add_metric([self.server, kind], float(value))
        yield family


class Metrics:
    """The metrics every server exposes on ``/metrics``."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "gym_http_requests", "Data requests by route and status", ["method", "route", "status"], registry=r
        )
        self.refused = Counter("gym_admission_refused", "Data requests refused by admission or fencing", ["code"], registry=r)
        self.phase_seconds = Histogram(
            "gym_control_phase_seconds",
            "Duration of control verbs",
            ["verb", "outcome"],
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.records_written = Counter("gym_checkpoint_records_written", "Records written at commit", registry=r)
        self.bytes_written = Counter("gym_checkpoint_bytes_written", "Record bytes written at commit", registry=r)
        self.records_restored = Counter("gym_checkpoint_records_restored", "Records installed by restore", registry=r)
        self.bytes_restored = Counter("gym_checkpoint_bytes_restored", "Record bytes read by restore", registry=r)
        self.lease_expiries = Counter("gym_checkpoint_lease_expiries", "Checkpoints aborted by lease expiry", registry=r)
        self.restore_decisions = Counter(
            "gym_checkpoint_restore_decisions",
            "Restores a server resumed or undid by their decision object after its lease ran out",
            ("decision",),
            registry=r,
        )
        self.admission_open = Gauge("gym_admission_open", "1 while data admission is open", registry=r)
        self.admission_open.set(1)

    def track_live(self, read: Callable[[], dict[str, Any]]) -> None:
        self.registry.register(_LiveCollector(self.server, read))

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, list(labels), registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, list(labels), registry=self.registry)

    async def endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
