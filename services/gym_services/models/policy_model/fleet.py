"""The inference workers behind one policy model: which one streams the next generation, and which are up.

The policy model's upstream is one worker or a fleet of them (vLLM data-parallel replicas in
production, the built-in worker here): ``upstream.base_url`` lists them (a list, or one URL with a
``{a..b}`` range), or names a headless Service that ``upstream.resolve`` turns into one worker per
address it resolves to (re-resolved every ``resolve_interval_s``; an address that disappears takes no
new stream, its open streams go on). Any worker can continue any generation: a prefix carries
everything, so generations need no affinity to a worker.

Load: each new stream goes to the healthy worker with the fewest **outstanding tokens** — the tokens
its open streams are still expected to generate (a stream's expected length is its ``max_tokens``, or
the running mean of the lengths this policy model has seen, less what it already received). Ties go
to the worker with fewer streams, then round-robin. The view is this policy model's own: with
several policy model replicas sharing a fleet, each balances its own streams.

Health: a stream that fails on a worker (refused, reset, broken off, a ``5xx``/``429`` answer, an end
without ``finish_reason``) marks it down at once, and the generation continues from its prefix on
another healthy worker without waiting (:mod:`.generations`). Every ``health_interval_s`` each
worker's ``GET <base_url>/models`` is probed: a worker that answers ``200`` is up again, one that does
not is down. When no worker is up, the least recently failed one is tried, after the generation's
backoff, so a single restarting worker behaves as before.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from prometheus_client import Counter, Gauge

from gym_services.base.affinity import expand_endpoints
from gym_services.base.logs import get_logger
from gym_services.base.metrics import Metrics

log = get_logger("policy_model.fleet")

#: resolves a host name and port to its addresses (``loop.getaddrinfo`` by default)
Resolver = Callable[[str, int], Awaitable[list[str]]]


@dataclass(frozen=True)
class FleetMetrics:
    """Per-worker gauges and the failover counter, declared on the policy model's registry."""

    up: Gauge
    streams: Gauge
    outstanding: Gauge
    failovers: Counter

    @classmethod
    def declare(cls, metrics: Metrics) -> FleetMetrics:
        return cls(
            up=metrics.gauge("gym_model_worker_up", "1 when the inference worker takes new streams", ("worker",)),
            streams=metrics.gauge("gym_model_worker_streams", "Open streams on the inference worker", ("worker",)),
            outstanding=metrics.gauge(
                "gym_model_worker_outstanding_tokens",
                "Tokens the worker's open streams are still expected to generate",
                ("worker",),
            ),
            failovers=metrics.counter(
                "gym_model_failovers", "Generations continued on another worker after theirs failed"
            ),
        )


@dataclass(eq=False)
class Stream:
    """One open upstream stream on one worker."""

    worker: Worker
    expected: int  # tokens it is expected to generate
    received: int = 0

    def remaining(self) -> int:
        return max(1, self.expected - self.received)


@dataclass(eq=False)
class Worker:
    """One inference worker: where it is and what this policy model knows of it."""

    base_url: str
    healthy: bool = True
    removed: bool = False  # no longer resolved: takes no new stream
    streams: set[Stream] = field(default_factory=set)
    failures: int = 0
    failed_at: float = 0.0
    last_error: str | None = None
    tokens_received: int = 0  # every token its streams delivered to this policy model
    finished_streams: int = 0  # streams it ended with a finish_reason
    finished_tokens: int = 0  # the tokens of those streams (the rest were continued elsewhere or cut)
    #: the open streams' remaining tokens, kept as they change (a sum over thousands of streams at every stream's
    #: start and end took a policy model's event loop a tenth of its time at 4,096 rollouts)
    remaining: int = 0

    @property
    def chat_url(self) -> str:
        return self.base_url + "/chat/completions"

    @property
    def models_url(self) -> str:
        return self.base_url + "/models"

    def outstanding(self) -> int:
        return self.remaining

    def describe(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "removed": self.removed,
            "streams": len(self.streams),
            "outstanding_tokens": self.outstanding(),
            "failures": self.failures,
            "last_error": self.last_error,
            "tokens_received": self.tokens_received,
            "finished_streams": self.finished_streams,
            "finished_tokens": self.finished_tokens,
        }


async def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (a headless Service: one per ready pod)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class Fleet:
    """The workers of one policy model and the choice among them."""

    def __init__(
        self,
        base_url: str | list[str],
        *,
        expected_tokens: int = 512,
        resolve: bool = False,
        metrics: FleetMetrics | None = None,
        resolver: Resolver = resolve_host,
    ) -> None:
        self.configured = expand_endpoints(base_url)
        self.resolve = resolve
        self.resolver = resolver
        self.metrics = metrics
        self.workers: dict[str, Worker] = {}
        self.mean_tokens = float(expected_tokens)
        self.failovers = 0
        self._turn = itertools.count()
        if not resolve:
            for url in self.configured:
                self._add(url)

    # --- choosing ----------------------------------------------------------------------

    def candidates(self) -> list[Worker]:
        return [w for w in self.workers.values() if not w.removed]

    def pick(self) -> Worker | None:
        """The healthy worker with the fewest outstanding tokens; else the least recently failed one."""
        live = self.candidates()
        if not live:
            return None
        healthy = [w for w in live if w.healthy]
        if not healthy:
            return min(live, key=lambda w: w.failed_at)
        turn = next(self._turn)
        return min(
            healthy,
            key=lambda w: (w.outstanding(), len(w.streams), (healthy.index(w) - turn) % len(healthy)),
        )

    def expected(self, max_tokens: int | None, prefix_tokens: int) -> int:
        """How many tokens a stream continuing after ``prefix_tokens`` is expected to generate."""
        guess = max(1, round(self.mean_tokens) - prefix_tokens)
        return min(guess, max_tokens) if max_tokens else guess

    def open(self, worker: Worker, expected: int) -> Stream:
        stream = Stream(worker, expected)
        worker.streams.add(stream)
        worker.remaining += stream.remaining()
        self._export(worker)
        return stream

    def close(self, stream: Stream, total_tokens: int | None = None) -> None:
        """The stream ended; ``total_tokens`` is the whole generation's length when it finished."""
        if stream in stream.worker.streams:
            stream.worker.streams.discard(stream)
            stream.worker.remaining -= stream.remaining()
        if total_tokens is not None:
            stream.worker.finished_streams += 1
            stream.worker.finished_tokens += stream.received
        if total_tokens is not None and total_tokens > 0:
            self.mean_tokens += (total_tokens - self.mean_tokens) * 0.05
        self._export(stream.worker)

    def received(self, stream: Stream, tokens: int = 1) -> None:
        before = stream.remaining()
        stream.received += tokens
        stream.worker.tokens_received += tokens
        if stream in stream.worker.streams:
            stream.worker.remaining += stream.remaining() - before

    def counted(self, stream: Stream, tokens: int) -> None:
        """The upstream says how many tokens the stream has generated so far (its usage)."""
        if tokens > stream.received:
            self.received(stream, tokens - stream.received)

    # --- health ------------------------------------------------------------------------

    def failed(self, worker: Worker, error: str) -> None:
        """A stream failed on ``worker``: it takes no new stream until a probe finds it up."""
        worker.failures += 1
        worker.failed_at = time.monotonic()
        worker.last_error = error[:300]
        if worker.healthy:
            worker.healthy = False
            log.warning("inference worker down", extra={"worker": worker.base_url, "error": worker.last_error})
        self._export(worker)

    def can_fail_over(self, failed_url: str | None) -> bool:
        """Whether a generation whose stream failed on ``failed_url`` can continue at once elsewhere."""
        return failed_url is not None and any(w.healthy and w.base_url != failed_url for w in self.candidates())

    def failed_over(self) -> None:
        self.failovers += 1
        if self.metrics is not None:
            self.metrics.failovers.inc()

    def probed(self, worker: Worker, ok: bool, error: str | None = None) -> None:
        if ok and not worker.healthy:
            log.info("inference worker up", extra={"worker": worker.base_url})
        if not ok:
            if worker.healthy:
                self.failed(worker, error or "health probe failed")
            return
        worker.healthy = True
        self._export(worker)

    async def probe(self, client: Any, timeout_s: float) -> None:
        """Probe every worker once, concurrently."""

        async def one(worker: Worker) -> None:
            try:
                response = await client.get(worker.models_url, timeout=timeout_s)
                self.probed(worker, response.status_code == 200, f"health probe answered {response.status_code}")
            except Exception as exc:
                self.probed(worker, False, f"health probe failed: {type(exc).__name__}: {exc}")

        await asyncio.gather(*(one(w) for w in self.candidates()))

    # --- resolution ----------------------------------------------------------------------

    async def refresh(self) -> None:
        """Resolve every configured URL's host: one worker per address; vanished addresses take no new stream."""
        if not self.resolve:
            return
        found: list[str] = []
        for url in self.configured:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            try:
                addresses = await self.resolver(parts.hostname or "", port)
            except OSError as exc:
                log.warning("cannot resolve the workers' host", extra={"url": url, "error": str(exc)})
                return  # keep what we had: a DNS hiccup is not every worker gone
            for address in addresses:
                host = f"[{address}]" if ":" in address else address
                found.append(urlunsplit((parts.scheme, f"{host}:{port}", parts.path, "", "")).rstrip("/"))
        for url in found:
            worker = self.workers.get(url)
            if worker is None:
                self._add(url)
                log.info("inference worker found", extra={"worker": url})
            elif worker.removed:
                worker.removed = False
        for url, worker in self.workers.items():
            if url not in found and not worker.removed:
                worker.removed = True
                log.info("inference worker no longer resolved", extra={"worker": url})
                self._export(worker)
        for url in [u for u, w in self.workers.items() if w.removed and not w.streams]:
            del self.workers[url]

    # --- reporting ---------------------------------------------------------------------

    def _add(self, url: str) -> None:
        self.workers[url] = Worker(url)
        self._export(self.workers[url])

    def _export(self, worker: Worker) -> None:
        if self.metrics is None:
            return
        self.metrics.up.labels(worker=worker.base_url).set(1 if worker.healthy and not worker.removed else 0)
        self.metrics.streams.labels(worker=worker.base_url).set(len(worker.streams))
        self.metrics.outstanding.labels(worker=worker.base_url).set(worker.outstanding())

    def counts(self) -> dict[str, Any]:
        live = self.candidates()
        return {
            "workers": len(live),
            "workers_healthy": sum(1 for w in live if w.healthy),
            "failovers": self.failovers,
            "worker_states": {w.base_url: w.describe() for w in self.workers.values()},
        }
