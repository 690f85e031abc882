"""The phases of one participant and the only moves allowed between them (``docs/protocol.md``, "Phases").

The control plane (:mod:`gym_services.control.plane`) moves its :class:`PhaseMachine`; admission
(:mod:`gym_services.control.admission`) opens and closes with the phase. A move the table does not
allow is a bug in the plane, never a client's fault: it raises :class:`IllegalTransition`.
"""

from __future__ import annotations

from prometheus_client import Gauge

from gym_services.base.logs import get_logger
from gym_services.control.admission import Admission
from gym_services.control.protocol import OPEN_PHASES, Phase

log = get_logger("control")

#: phase -> the phases it may move to
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.FRESH: frozenset({Phase.PREPARING, Phase.RESTORING}),
    Phase.OPEN: frozenset({Phase.PREPARING, Phase.RESTORING}),
    # prepare ends prepared or blocked; abort (or resume, which then abandons) and lease expiry reopen
    Phase.PREPARING: frozenset({Phase.PREPARED, Phase.BLOCKED, Phase.OPEN}),
    # capture freezes the scope; persist writes it, before resume (sync) or after (the background method)
    Phase.PREPARED: frozenset({Phase.CAPTURED, Phase.OPEN}),
    Phase.BLOCKED: frozenset({Phase.OPEN}),
    # resume (or persist, under the pause) starts the upload; abort (or lease expiry) drops the capture; a final
    # checkpoint's written upload holds it until the process exits
    Phase.CAPTURED: frozenset({Phase.OPEN, Phase.FINAL}),
    # a final checkpoint whose publish failed is aborted: the server serves again until it exits
    Phase.FINAL: frozenset({Phase.OPEN}),
    # a restore that fails, or is aborted, goes back to where the process was (fresh or open)
    Phase.RESTORING: frozenset({Phase.RESTORED, Phase.FRESH, Phase.OPEN}),
    Phase.RESTORED: frozenset({Phase.OPEN, Phase.FRESH}),
}


class IllegalTransition(RuntimeError):
    """The plane tried a move :data:`TRANSITIONS` does not allow."""


class PhaseMachine:
    """The current phase; every move is checked, opens or closes admission, and is logged as the last event."""

    def __init__(self, admission: Admission, admission_open: Gauge) -> None:
        self.phase = Phase.FRESH
        self.last_event: str | None = None
        self._admission = admission
        self._admission_open = admission_open

    def can(self, to: Phase) -> bool:
        return to in TRANSITIONS[self.phase]

    def move(self, to: Phase, event: str, checkpoint_id: str | None) -> None:
        if not self.can(to):
            raise IllegalTransition(f"{self.phase} -> {to} is not a phase transition ({event})")
        self.phase = to
        self._admission.set(to in OPEN_PHASES, checkpoint_id, to)
        self._admission_open.set(1 if self._admission.is_open else 0)
        self.last_event = event
        log.info(event, extra={"phase": to, "checkpoint_id": checkpoint_id})
