"""A server's termination: the signal that it is being stopped, its deadline, and when it may exit.

``gymckpt serve`` (:mod:`gym_services.server.serve`) begins it on the first SIGTERM when the server has a grace
(``checkpoint.termination_grace_s``), and exits once :meth:`Termination.exit_due` names a reason. Meanwhile the
server keeps serving and holding its state, so that the stack can take one *final* checkpoint of it: the control
plane (:mod:`gym_services.control.plane`) shows the termination in ``status``, makes a checkpoint prepared meanwhile
final, and calls :meth:`Termination.persisted` once its part of a final checkpoint is written: a terminating server
then exits at once (``docs/protocol.md``, "Termination").

A participant that holds a final checkpoint it was not signalled for (another pod of the stack was preempted) is
asked to exit too when the checkpoint's pause lease runs out (:meth:`Termination.request_exit`): the checkpoint is
the end of its process's life, and the restore continues it in a fresh one.

A server that is no participant (a backend: an inference worker, a sandbox) holds no state but terminates the same
way, so that the participants calling it reach their boundaries while the final checkpoint is taken; it exits at the
deadline or at a later SIGINT (``holds_state`` false: the local stack's supervisor stops it so once the final
checkpoint is published).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time

from prometheus_client import Gauge

from gym_services.base.logs import get_logger
from gym_services.control.models import TerminationStatus

log = get_logger("control")


class ExitReason(enum.StrEnum):
    """Why a server ended its termination (the ``outcome`` of ``gym_control_terminations_total``)."""

    FINAL_PERSISTED = "final_persisted"  # its part of a final checkpoint is written: nothing left to keep
    DEADLINE = "deadline"  # the grace ran out first
    FINAL_HELD = "final_held"  # it held a final checkpoint it was not signalled for, and nobody renewed its lease


class Termination:
    """The server's termination, once signalled: which signal, when, the deadline, and the final checkpoint its part
    was persisted for. ``grace_s`` 0: SIGTERM is no termination (the server drains and exits as it always did)."""

    def __init__(self, grace_s: float, gauge: Gauge | None = None, *, holds_state: bool = True) -> None:
        self.grace_s = grace_s
        self.holds_state = holds_state
        self._gauge = gauge  # ``gym_control_terminating``
        self.signal: str | None = None
        self.signalled_at: float | None = None  # wall clock, for status
        self._deadline: float | None = None  # monotonic
        self.final_checkpoint_id: str | None = None
        self._exit: ExitReason | None = None
        self._begun: asyncio.Event | None = None  # made in the server's loop, by the first status long-poll

    @property
    def enabled(self) -> bool:
        return self.grace_s > 0

    @property
    def active(self) -> bool:
        """Signalled: the server is terminating."""
        return self.signalled_at is not None

    def begin(self, signal: str) -> bool:
        """The first termination signal starts the grace; a later one changes nothing (False)."""
        if self.active:
            log.warning(
                "termination signal again: the deadline stays",
                extra={"signal": signal, "left_s": round(self.left_s() or 0.0, 3)},
            )
            return False
        self.signal = signal
        self.signalled_at = time.time()
        self._deadline = time.monotonic() + self.grace_s
        log.warning(
            "terminating: holding state for a final checkpoint until its part is persisted or the grace ends",
            extra={"signal": signal, "grace_s": self.grace_s},
        )
        if self._begun is not None:
            self._begun.set()
        if self._gauge is not None:
            self._gauge.set(1)
        return True

    def left_s(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def persisted(self, checkpoint_id: str) -> None:
        """This server's part of final checkpoint ``checkpoint_id`` is written: a terminating server may exit."""
        self.final_checkpoint_id = checkpoint_id

    def request_exit(self, reason: ExitReason) -> None:
        """Exit although not signalled (a final checkpoint held past its lease)."""
        if self._exit is None:
            self._exit = reason

    def exit_due(self) -> ExitReason | None:
        """Why the server should exit now, or None while it should go on serving."""
        if self._exit is not None:
            return self._exit
        if not self.active:
            return None
        if self.final_checkpoint_id is not None:
            return ExitReason.FINAL_PERSISTED
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return ExitReason.DEADLINE
        return None

    def stopping(self) -> None:
        """The server is shutting down: every status long-poll is answered now (a waiting one would hold up the
        shutdown's drain)."""
        if self._begun is None:
            self._begun = asyncio.Event()
        self._begun.set()

    async def wait_begun(self, timeout_s: float) -> bool:
        """Until the server is terminating (True) or ``timeout_s`` passed or it is shutting down (False): the status
        long-poll."""
        if self.active:
            return True
        if self._begun is None:
            self._begun = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._begun.wait(), timeout_s)
        return self.active

    def status(self) -> TerminationStatus | None:
        if self.signalled_at is None or self.signal is None:
            return None
        return TerminationStatus(
            signal=self.signal,
            signalled_at=self.signalled_at,
            deadline_at=self.signalled_at + self.grace_s,
            left_s=round(self.left_s() or 0.0, 3),
            grace_s=self.grace_s,
            final_checkpoint_id=self.final_checkpoint_id,
        )
