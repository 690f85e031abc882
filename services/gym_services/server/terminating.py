"""uvicorn's server with the termination of ``docs/protocol.md`` ("Termination"): SIGTERM starts a grace instead of
a shutdown.

:func:`gym_services.server.serve.run` serves every server with :class:`TerminatingServer`. Given a
:class:`~gym_services.control.termination.Termination` (a checkpoint participant with a grace), the first SIGTERM
begins it: the server goes on serving its data and control routes, so that the stack can take a final checkpoint of
it, and shuts down (draining its requests) once the termination names a reason to exit. A SIGTERM or SIGINT after
that changes nothing; only SIGKILL ends it sooner. A first SIGINT (Ctrl-C, ``gymckpt down --no-checkpoint``) stops it
at once, as uvicorn does, and so does any signal without a termination.
"""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn

from gym_services.base.logs import get_logger
from gym_services.control.termination import ExitReason, Termination

log = get_logger("server")

#: how long a server that persisted its part of a final checkpoint lets its requests finish: what it would still
#: answer (an agent's parked /run, a late tool call) comes after the checkpoint, and the restore throws it away
FINAL_DRAIN_S = 1


class TerminatingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, termination: Termination | None) -> None:
        super().__init__(config)
        self.termination = termination
        self._signalled: str | None = None  # set by the handler, applied in the loop (on_tick)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        termination = self.termination
        first_interrupt = sig == signal.SIGINT and self._signalled is None
        if termination is None or first_interrupt:
            super().handle_exit(sig, frame)
            return
        if self._signalled is None:
            self._signalled = signal.Signals(sig).name  # begun in the event loop, at its next tick
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
        status = termination.status()
        log.warning(
            "exiting at the end of the termination",
            extra={
                "outcome": reason,
                "final_checkpoint_id": termination.final_checkpoint_id,
                "left_s": status.left_s if status is not None else None,
            },
        )
        if reason is not ExitReason.DEADLINE:
            self.config.timeout_graceful_shutdown = min(
                self.config.timeout_graceful_shutdown or FINAL_DRAIN_S, FINAL_DRAIN_S
            )
        self.should_exit = True
