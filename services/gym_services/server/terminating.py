"""uvicorn's server with the termination of ``docs/protocol.md`` ("Termination"): SIGTERM starts a grace instead of
a shutdown.

:func:`gym_services.server.serve.run` serves every server with :class:`TerminatingServer`. Given a
:class:`~gym_services.control.termination.Termination` (a checkpoint participant or a backend with a grace), the first
SIGTERM begins it: the server goes on serving its data and control routes, so that the stack can take a final
checkpoint of it, and shuts down (draining its requests) once the termination names a reason to exit. A SIGTERM or
SIGINT after that changes nothing for a server that holds state; only SIGKILL ends it sooner (a backend, holding
none, stops at a later SIGINT). A first SIGINT (Ctrl-C, ``gymckpt down --no-checkpoint``) stops it at once, as
uvicorn does, and so does any signal without a termination.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from gym_services.base.logs import get_logger
from gym_services.control.termination import ExitReason, Termination

log = get_logger("server")

#: how long a server that persisted its part of a final checkpoint lets its requests finish: what it would still
#: answer (an agent's parked /run, a late tool call) comes after the checkpoint, and the restore throws it away
FINAL_DRAIN_S = 1


class TerminatingServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        termination: Termination | None,
        live: Callable[[], dict[str, Any]] | None = None,
        counters: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        super().__init__(config)
        self.termination = termination
        self.live = live  # the participant's live counts, logged at exit: what it held at the cut
        self.counters = counters  # its metrics' counters, logged at exit: what it did in its life
        self._signalled: str | None = None  # set by the handler, applied in the loop (on_tick)
        self._reason: str | None = None  # why the termination ended (logged at shutdown)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        termination = self.termination
        first_interrupt = sig == signal.SIGINT and self._signalled is None
        if termination is None or not termination.enabled or first_interrupt:
            super().handle_exit(sig, frame)
            return
        if self._signalled is None:
            self._signalled = signal.Signals(sig).name  # begun in the event loop, at its next tick
        elif sig == signal.SIGINT and not termination.holds_state:
            super().handle_exit(sig, frame)  # a backend: nothing to keep, the stack is done with it
        else:
            log.warning("signal ignored while terminating", extra={"signal": signal.Signals(sig).name})

    async def on_tick(self, counter: int) -> bool:
        termination = self.termination
        if termination is not None and self._signalled is not None and not termination.active:
            termination.begin(self._signalled)
        if termination is not None and not self.should_exit:
            reason = termination.exit_due()
            if reason is not None:
                self._exit(termination, reason)
        return await super().on_tick(counter)

    def _exit(self, termination: Termination, reason: ExitReason) -> None:
        self._reason = str(reason)
        if reason is not ExitReason.DEADLINE:
            self.config.timeout_graceful_shutdown = min(
                self.config.timeout_graceful_shutdown or FINAL_DRAIN_S, FINAL_DRAIN_S
            )
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """One log line with why the server stops and what it held then (its live counts), then uvicorn's shutdown."""
        termination = self.termination
        status = termination.status() if termination is not None else None
        try:
            live = self.live() if self.live is not None else None
            counters = self.counters() if self.counters is not None else None
        except Exception:  # the counts are for the log only: never a reason not to exit
            live = counters = None
        log.warning(
            "exiting",
            extra={
                "outcome": self._reason or "stopped",
                "final_checkpoint_id": termination.final_checkpoint_id if termination is not None else None,
                "left_s": status.left_s if status is not None else None,
                "live": live,
                "counters": counters,
            },
        )
        if termination is not None:
            termination.stopping()
        await super().shutdown(sockets)
