"""Best-effort status writes: the transaction never waits for, or fails with, the Kubernetes API.

Fenced: each write is checked against the leadership right before it goes (``fence``: a leader whose leadership may
have passed ends there) and is conditional on the resource's ``resourceVersion`` as the operator last saw it
(``version``: kopf's live body, or the version its own last write made while that body lags), so a write that was
on its way when a newer leader wrote is refused (409). After a 409 the writer reads the object's resourceVersion
again and tries over it, fenced again: only a leader that is still one writes. (The live body alone cannot be
waited for: while kopf runs the resource's deletion handler, which waits for the transaction to end, it applies no
newer event to that body, and the transaction would wait for its last status write for ever.)

:class:`StatusWriter` keeps the status one resource should have and writes it in the background,
as a JSON merge patch of the status subresource: a write that fails (no answer, 409, 429, 5xx) is
logged and retried with backoff (a 429's ``Retry-After`` obeyed), newer writes folding into the one
pending; a 404 means the resource is gone and ends the writing. The coordinator's progress (the
operator's event sink) only hands statuses over, so abort and resume run on time whatever the API
server answers (``docs/protocol.md``, "Kubernetes"). Every write carries ``observedGeneration``,
and each condition keeps its ``lastTransitionTime`` unless its status changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from gym_operator.kube import Gone, Kube, KubeError, Unavailable
from gym_operator.status import keep_transition_times
from gym_services.base.backoff import Backoff

log = logging.getLogger("gym.operator")

FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0


class StatusWriter:
    """The status of one Checkpoint or Restore, written in the background until it is in."""

    def __init__(
        self,
        kube: Kube,
        plural: str,
        namespace: str,
        name: str,
        generation: int | None,
        current: dict[str, Any] | None,
        fence: Callable[[], object] | None = None,
        version: Callable[[], str | None] | None = None,
    ) -> None:
        self.kube, self.plural, self.namespace, self.name = kube, plural, namespace, name
        self.fence, self.version = fence, version
        self.generation = generation
        self.conditions: list[dict[str, Any]] = list((current or {}).get("conditions") or [])
        self.written: dict[str, Any] = dict(current or {})  # what the resource is known to hold
        self.gone = False
        self.failures = 0  # writes that failed and were retried
        self._pending: dict[str, Any] | None = None
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._stale: str | None = None  # a version of the live body known to be old...
        self._newer: str | None = None  # ...and the version read or written since

    @property
    def status(self) -> dict[str, Any]:
        """What the resource holds once every pending write is in."""
        return {**self.written, **(self._pending or {})}

    def write(self, status: dict[str, Any]) -> None:
        """Queue ``status`` (fields to set; None removes one); returns at once."""
        if self.gone:
            return
        update = dict(status)
        if self.generation is not None:
            update["observedGeneration"] = self.generation
        if "conditions" in update:
            update["conditions"] = keep_transition_times(self.conditions, update["conditions"])
            self.conditions = update["conditions"]
        self._pending = {**(self._pending or {}), **update}
        self._idle.clear()
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"status of {self.plural}/{self.name}")

    async def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued write is in (True), the resource is gone, or ``timeout_s`` passes."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return not self.gone

    async def close(self) -> None:
        """Stop writing (what is still pending is dropped)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._idle.set()

    async def _run(self) -> None:
        retry = Backoff(FIRST_BACKOFF_S, MAX_BACKOFF_S)
        while self._pending is not None:
            self._changed.clear()
            patch = self._pending
            live = None
            try:
                if self.fence is not None:
                    self.fence()
                live = self.version() if self.version is not None else None
                version = self._newer if self._newer is not None and live == self._stale else live
                written = await self.kube.patch_status(self.plural, self.namespace, self.name, patch, version)
                if live is not None and written is not None:
                    self._stale, self._newer = live, written
            except Gone:
                log.warning(f"{self.plural}/{self.name} is gone; its status is no longer written")
                self.gone, self._pending = True, None
                break
            except Unavailable as exc:
                self.failures += 1
                if exc.status == 409 and live is not None:
                    await self._read_version(live)
                delay = max(retry.wait_s(), exc.retry_after or 0.0)
                log.warning(f"status write failed ({exc}); retrying in {delay:.1f}s")
                try:
                    await asyncio.wait_for(self._changed.wait(), delay)  # a newer status is retried at once...
                    await asyncio.sleep(min(delay, FIRST_BACKOFF_S))  # ...after a short pause
                except TimeoutError:
                    pass
                continue
            except KubeError as exc:
                # 4xx other than 404/409/429: the write itself is refused (a bug, or RBAC); retrying cannot help
                self.failures += 1
                log.error(f"status write refused ({exc}); dropped: {sorted(patch)}")
            else:
                self.written.update({k: v for k, v in patch.items() if v is not None})
                for key in [k for k, v in patch.items() if v is None]:
                    self.written.pop(key, None)
            retry.reset()
            if self._pending is patch:
                self._pending = None
        self._idle.set()

    async def _read_version(self, refused: str) -> None:
        """After a 409 over version ``refused``: the object's resourceVersion now, for the next try (no answer: the
        next try reads it again)."""
        try:
            now = await self.kube.resource_version(self.plural, self.namespace, self.name)
        except KubeError as exc:
            log.info(f"{self.plural}/{self.name}: its resourceVersion could not be read ({exc})")
            return
        if now is not None:
            self._stale, self._newer = refused, now
