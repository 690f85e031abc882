"""What a running job waits for: the agents' downstream reports, and a warning when no episode finishes.

An agent retries a server behind it that is down (a resources server killed, the model's worker gone) itself, and
its ``/run`` answers nothing meanwhile; so every ``downstream_poll_s`` while episodes are live the collection reads
``GET /health/downstream`` of the agents running them (:class:`~gym_services.base.downstream.DownstreamReport`) and
shows what they wait for in ``/jobs/current`` (``failing``, and first in ``last_failure``) until they report nothing
again. When a running job makes no progress for ``stall_warning_s`` the log says so, again every
``stall_warning_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import ValidationError

from gym_services.base.downstream import DOWNSTREAM_PATH, DownstreamFailure, DownstreamReport
from gym_services.base.logs import get_logger

log = get_logger("collection")


class Watch:
    """The downstream poller and the stall watchdog of a job.

    ``done`` is set once the job has finished, ``gate`` while it may dispatch (cleared: paused);
    ``replicas()`` gives the base URL of every agent replica running a live episode and its name, ``waiting()``
    what the job waits on, for the stall warning."""

    def __init__(
        self,
        done: asyncio.Event,
        gate: asyncio.Event,
        replicas: Callable[[], dict[str, str]],
        waiting: Callable[[], dict[str, Any]],
        *,
        stall_warning_s: float = 60.0,
        downstream_poll_s: float = 2.0,
    ) -> None:
        self._done = done
        self._gate = gate
        self._replicas = replicas
        self._waiting = waiting
        self.stall_warning_s = stall_warning_s
        self.downstream_poll_s = downstream_poll_s
        #: agent (replica) -> the downstream calls its episodes are retrying, from its latest report
        self.downstream: dict[str, list[DownstreamFailure]] = {}
        self.progress_at = time.monotonic()  # the last result, or the job's (re)start
        self._client: httpx.AsyncClient | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None

    def start(self, client: httpx.AsyncClient) -> None:
        """A job (re)starts: its progress counts from now, and both watchers run (again, if they had ended)."""
        self._client = client
        self.progress_at = time.monotonic()
        self.downstream = {}
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch_progress(), name="collection-watchdog")
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_downstream(), name="collection-downstream")

    def progressed(self) -> None:
        """An episode finished."""
        self.progress_at = time.monotonic()

    def idle_s(self) -> float:
        return time.monotonic() - self.progress_at

    def tasks(self) -> list[asyncio.Task[None]]:
        return [task for task in (self._watchdog, self._poller) if task is not None]

    async def _watch_progress(self) -> None:
        """Say so in the log when a running job makes no progress for ``stall_warning_s`` (again every
        ``stall_warning_s``): its servers may be down, and the episodes retrying say which."""
        warned_at = self.progress_at
        while not self._done.is_set():
            await asyncio.sleep(min(5.0, self.stall_warning_s / 4))
            now = time.monotonic()
            if not self._gate.is_set() or now - max(self.progress_at, warned_at) < self.stall_warning_s:
                continue
            warned_at = now
            log.warning(
                "no episode has finished for a while",
                extra={"idle_s": round(now - self.progress_at), **self._waiting()},
            )

    async def _poll_downstream(self) -> None:
        """Every ``downstream_poll_s`` while the job runs: what the agents running live episodes are waiting for."""
        while not self._done.is_set():
            await asyncio.sleep(self.downstream_poll_s)
            replicas = self._replicas()
            reports = await asyncio.gather(*(self._downstream_of(url) for url in replicas))
            self.downstream = {
                replicas[url]: failures for url, failures in zip(replicas, reports, strict=True) if failures
            }
        self.downstream = {}

    async def _downstream_of(self, url: str) -> list[DownstreamFailure]:
        """The agent's report; nothing when it cannot say (unreachable: the episodes' own calls report that)."""
        assert self._client is not None
        timeout = min(5.0, max(1.0, self.downstream_poll_s))
        try:
            resp = await self._client.get(f"{url}{DOWNSTREAM_PATH}", timeout=timeout)
            if resp.status_code != 200:
                return []
            return DownstreamReport.model_validate_json(resp.content).failing
        except (httpx.HTTPError, ValidationError):
            return []
