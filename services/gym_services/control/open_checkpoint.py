"""The checkpoint (or restore) open on one server, and how one opens and closes.

One per control plane (:mod:`gym_services.control.plane`), shared by its verbs: the checkpoint verbs
(:mod:`.checkpointing`), resume and abort (:mod:`.closing`) and restore (:mod:`.restoring`). It holds the open
checkpoint's id and what is in progress for it (a capture waiting for resume, its upload, a restore), moves the
phase machine (:mod:`.phases`, which opens and closes admission), runs the pause lease (:mod:`.lease`), and runs
each verb once per checkpoint id (:mod:`.repeats`), timing it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.control.lease import Lease
from gym_services.control.metrics import ControlMetrics
from gym_services.control.models import PhaseResponse, RestoreResponse
from gym_services.control.participant import F, V
from gym_services.control.persists import PendingCapture, PersistJob
from gym_services.control.phases import PhaseMachine
from gym_services.control.protocol import Phase, Role, Verb
from gym_services.control.repeats import RepeatCalls
from gym_services.control.store import CheckpointStore

T = TypeVar("T")


@dataclass
class RestoreInProgress(Generic[V]):
    """A restore from its start until the checkpoint closes."""

    before: Phase  # where the process was: an undone restore goes back there
    decision: tuple[CheckpointStore, str] | None = None  # where its decision object is, when the coordinator named it
    validated: V | None = None  # what the participant validated and installed
    answer: RestoreResponse | None = None


class OpenCheckpoint(Generic[V, F]):
    """The open checkpoint's id, its phase, its lease, its calls, and what is in progress for it."""

    def __init__(self, participant_id: str, role: Role, phases: PhaseMachine, metrics: ControlMetrics) -> None:
        self.participant_id = participant_id
        self.role = role
        self.phases = phases
        self.metrics = metrics
        self.lease = Lease()
        self.calls = RepeatCalls()
        self.id: str | None = None
        self.restoring: RestoreInProgress[V] | None = None
        self.captured: PendingCapture[F] | None = None  # a capture waiting for resume
        self.persisting: PersistJob | None = None  # its upload, when ``persist`` came before resume
        #: a final checkpoint (asked for, or prepared while the server terminates): never resumed (:mod:`.final`)
        self.final = False

    @property
    def phase(self) -> Phase:
        return self.phases.phase

    def move(self, phase: Phase, event: str) -> None:
        self.phases.move(phase, event, self.id)

    def response(self, detail: str = "", checkpoint_id: str | None = None) -> PhaseResponse:
        return PhaseResponse(
            checkpoint_id=checkpoint_id or self.id,
            participant_id=self.participant_id,
            role=self.role,
            phase=self.phase,
            detail=detail,
        )

    def require(self, checkpoint_id: str) -> None:
        """``404 unknown_checkpoint`` unless ``checkpoint_id`` is the open one."""
        if self.id is None:
            raise ApiError(ErrorCode.UNKNOWN_CHECKPOINT, f"no checkpoint is open on {self.participant_id}")
        if checkpoint_id != self.id:
            raise ApiError(
                ErrorCode.UNKNOWN_CHECKPOINT,
                f"checkpoint {checkpoint_id} is not the open one ({self.id}) on {self.participant_id}",
            )

    def refuse_busy(self, verb: Verb, checkpoint_id: str) -> None:
        """``409 checkpoint_busy`` while another checkpoint is open."""
        if self.id is not None:
            raise ApiError(
                ErrorCode.CHECKPOINT_BUSY,
                f"checkpoint {self.id} is open on {self.participant_id} (phase {self.phase}); "
                f"cannot {verb} {checkpoint_id}",
                details={"open_checkpoint_id": self.id, "phase": self.phase},
            )

    async def once(self, verb: Verb, checkpoint_id: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` once for (verb, checkpoint id), timed; a repeat gets the same answer."""
        return await self.calls.once(verb, checkpoint_id, lambda: self._timed(verb, work))

    async def _timed(self, verb: Verb, work: Callable[[], Awaitable[T]]) -> T:
        started = time.perf_counter()
        outcome = "error"
        try:
            result = await work()
            outcome = getattr(result, "status", "ok")
            return result
        finally:
            self.metrics.phase_seconds.labels(verb=verb, outcome=outcome).observe(time.perf_counter() - started)

    def open(self, checkpoint_id: str, lease_s: float, phase: Phase, event: str) -> None:
        """A checkpoint (or restore) starts here: admission closes, the lease runs."""
        self.calls.opened(checkpoint_id)
        self.id = checkpoint_id
        self.lease.renew(lease_s)
        self.move(phase, event)

    def close(self, verb: Verb, event: str, phase: Phase) -> PhaseResponse:
        """End the open checkpoint: admission reopens, per-checkpoint calls are dropped."""
        checkpoint_id = self.id
        assert checkpoint_id is not None
        self.id = None
        self.move(phase, event)
        self.lease.clear()
        self.restoring = None
        self.captured = None
        self.persisting = None
        self.final = False
        response = self.response(event, checkpoint_id)
        self.calls.close(checkpoint_id, verb, response)
        return response

    def undo_restore(self, event: str) -> None:
        """A failed restore installed nothing: go back to where the process was."""
        if self.phase is not Phase.RESTORING:
            return  # already closed (the server is stopping)
        before = self.restoring.before if self.restoring is not None else Phase.FRESH
        self.id = None
        self.lease.clear()
        self.restoring = None
        self.move(before, event)
