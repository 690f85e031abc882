"""The operator's Prometheus metrics, served at ``/metrics`` on its liveness port by every replica.

One registry per process (:data:`METRICS`). The leader's controllers record each transaction as it ends
(:meth:`OperatorMetrics.transaction`); every replica says whether it leads (:meth:`OperatorMetrics.lead`). The chart's
PrometheusRule and Grafana dashboard (``charts/gym-checkpoint/templates/monitoring.yaml``,
``charts/gym-checkpoint/dashboards/``) read these series:

- ``gym_operator_transactions_total{kind, release, result}``: Checkpoints and Restores ended, by result
  (``completed``, ``failed``);
- ``gym_operator_transaction_duration_seconds{kind, release}``: start to end (histogram);
- ``gym_operator_checkpoint_pause_seconds{release}``: how long the rollouts were paused (histogram);
- ``gym_operator_checkpoint_published_seconds{release}``: start until the manifest was written (histogram);
- ``gym_operator_transaction_bytes_total{kind, release}``: record bytes checkpointed or restored;
- ``gym_operator_last_successful_checkpoint_timestamp_seconds{release}`` and
  ``gym_operator_last_successful_checkpoint_age_seconds{release}``: the newest Completed Checkpoint of the
  release (a new leader reads it from the Checkpoints, so the alert does not fire after a failover);
- ``gym_operator_leader{release}``: 1 on the replica that holds the leadership, 0 on a standby.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gym_services.coordination.transaction import TransactionKind, TransactionResult

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: seconds: a pause of milliseconds to minutes, a transaction of up to an hour
PAUSE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DURATION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class _Age:
    """``..._age_seconds`` computed at each scrape from the newest successful checkpoint's time."""

    def __init__(self, newest: dict[str, float]) -> None:
        self.newest = newest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gym_operator_last_successful_checkpoint_age_seconds",
            "Seconds since the release's newest Completed Checkpoint",
            labels=["release"],
        )
        for release, at in self.newest.items():
            family.add_metric([release], max(0.0, time.time() - at))
        yield family


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.transactions = Counter(
            "gym_operator_transactions",
            "Checkpoints and Restores ended, by result",
            ["kind", "release", "result"],
            registry=r,
        )
        self.duration = Histogram(
            "gym_operator_transaction_duration_seconds",
            "Seconds from a transaction's start to its end",
            ["kind", "release"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.pause = Histogram(
            "gym_operator_checkpoint_pause_seconds",
            "Seconds the rollouts were paused by a checkpoint",
            ["release"],
            buckets=PAUSE_BUCKETS,
            registry=r,
        )
        self.published = Histogram(
            "gym_operator_checkpoint_published_seconds",
            "Seconds from a checkpoint's start until its manifest was written",
            ["release"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.bytes = Counter(
            "gym_operator_transaction_bytes", "Record bytes checkpointed or restored", ["kind", "release"], registry=r
        )
        self.last_success = Gauge(
            "gym_operator_last_successful_checkpoint_timestamp_seconds",
            "Unix time of the release's newest Completed Checkpoint",
            ["release"],
            registry=r,
        )
        self.leader = Gauge("gym_operator_leader", "1 on the replica holding the leadership", ["release"], registry=r)
        self._newest: dict[str, float] = {}
        r.register(_Age(self._newest))

    def lead(self, release: str, leading: bool) -> None:
        self.leader.labels(release=release).set(1 if leading else 0)

    def transaction(self, release: str, result: TransactionResult, seconds: float) -> None:
        kind = result.kind.value
        self.transactions.labels(kind=kind, release=release, result=result.status.value).inc()
        self.duration.labels(kind=kind, release=release).observe(seconds)
        if result.completed:
            self.bytes.labels(kind=kind, release=release).inc(result.bytes)
        if result.kind is TransactionKind.CHECKPOINT and result.completed:
            self.pause.labels(release=release).observe(result.pause_s)
            if result.published_s is not None:
                self.published.labels(release=release).observe(result.published_s)
            self.succeeded(release, time.time())

    def succeeded(self, release: str, at: float) -> None:
        """A Completed Checkpoint of ``release`` at unix time ``at`` (kept when newer than the one known)."""
        if at > self._newest.get(release, 0.0):
            self._newest[release] = at
            self.last_success.labels(release=release).set(at)

    def seed(self, release: str, checkpoints: list[dict[str, Any]]) -> None:
        """The newest Completed Checkpoint of the release among ``checkpoints`` (a new leader's first look)."""
        for obj in checkpoints:
            status = obj.get("status") or {}
            if (obj.get("spec") or {}).get("release") != release or status.get("phase") != "Completed":
                continue
            stamp = status.get("completionTime")
            if stamp:
                self.succeeded(release, dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


#: the process's metrics
METRICS = OperatorMetrics()
