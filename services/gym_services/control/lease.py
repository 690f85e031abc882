"""The lease a paused participant holds, and the watcher that acts when it runs out.

The control plane (:mod:`gym_services.control.plane`) renews it on prepare, capture, restore and
``lease``, clears it when the checkpoint closes, and gives the watcher the check to run: a lease
nobody renews aborts the checkpoint (or settles a restore by its decision object), so a dead
coordinator never leaves a server paused (``docs/protocol.md``, "Leases").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from gym_services.base.logs import get_logger
from gym_services.control.protocol import DEFAULT_LEASE_S

log = get_logger("control")


class Lease:
    def __init__(self) -> None:
        self.seconds = DEFAULT_LEASE_S
        self.deadline: float | None = None
        self._watcher: asyncio.Task[None] | None = None

    def renew(self, lease_s: float | None = None) -> None:
        """Run for ``lease_s`` (the last length given, when None) from now."""
        if lease_s is not None:
            self.seconds = lease_s
        self.deadline = time.monotonic() + self.seconds

    def clear(self) -> None:
        self.deadline = None

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def overdue_by_a_lease(self) -> bool:
        """Run out for a whole further lease: the last chance to wait for something is gone."""
        return self.deadline is not None and time.monotonic() >= self.deadline + self.seconds

    def watch(self, check: Callable[[], Awaitable[None]], interval_s: float, name: str) -> None:
        """Call ``check`` every ``interval_s`` until :meth:`stop`; a failing check is logged, the watcher goes on."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await check()
                except Exception:
                    log.exception("lease expiry handling failed")

        self._watcher = asyncio.create_task(loop(), name=name)

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
