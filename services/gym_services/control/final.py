"""A final checkpoint on one server's control plane (``docs/protocol.md``, "Termination").

A checkpoint is *final* when its coordinator says so (``prepare``'s ``final``: the checkpoint a termination takes)
or when it is prepared while this server is terminating (:mod:`.termination`): the stack ends its life at that cut
and continues from it in fresh processes. So it is never resumed here. ``resume`` is answered but keeps admission
closed, and starts the upload if ``persist`` did not (:meth:`FinalHold.hold`); once this server's part is written
it moves to ``final`` and tells its termination, so a terminating server exits at once. Its pause lease running out
after that asks the process to exit too (:meth:`FinalHold.expired`) instead of reopening admission: whatever it did
next, the restore would throw away. An ``abort`` (the checkpoint could not be published) reopens it as any abort
does (:mod:`.closing`, :meth:`FinalHold.aborted`).
"""

from __future__ import annotations

from typing import Generic

from gym_services.base.logs import get_logger
from gym_services.control.metrics import ControlMetrics
from gym_services.control.models import PhaseResponse
from gym_services.control.open_checkpoint import OpenCheckpoint
from gym_services.control.participant import F, V
from gym_services.control.persists import PersistJob, Persists
from gym_services.control.protocol import Phase
from gym_services.control.termination import ExitReason, Termination

log = get_logger("control")


class FinalHold(Generic[V, F]):
    def __init__(
        self,
        opened: OpenCheckpoint[V, F],
        persists: Persists[F],
        termination: Termination,
        metrics: ControlMetrics,
    ) -> None:
        self.opened = opened
        self.persists = persists
        self.termination = termination
        self.metrics = metrics
        self._watched: set[str] = set()

    def begin(self, checkpoint_id: str, asked: bool) -> None:
        """At ``prepare``: the checkpoint is final when asked to be, or when this server is terminating."""
        self.opened.final = asked or self.termination.active
        if self.opened.final:
            log.warning(
                "final checkpoint: it will not be resumed here",
                extra={"checkpoint_id": checkpoint_id, "asked": asked, "terminating": self.termination.active},
            )

    def hold(self, checkpoint_id: str) -> PhaseResponse:
        """``resume`` of a final checkpoint: admission stays closed; its upload starts now if it has not."""
        opened = self.opened
        if opened.phase is Phase.CAPTURED and opened.persisting is None and opened.captured is not None:
            opened.persisting = self.persists.start(opened.captured)
            opened.persisting.begin()  # nobody will ask for it with ``persist``: write it at once
        if opened.persisting is not None:
            self.watch(checkpoint_id, opened.persisting)
        return opened.response(
            f"resume {checkpoint_id}: a final checkpoint is not resumed; admission stays closed until the process exits"
        )

    def watch(self, checkpoint_id: str, job: PersistJob) -> None:
        """Once the upload of final checkpoint ``checkpoint_id`` is written, hold it in phase ``final``."""
        if checkpoint_id in self._watched or job.task is None:
            return
        self._watched.add(checkpoint_id)
        job.task.add_done_callback(lambda _: self._written(checkpoint_id, job))

    def _written(self, checkpoint_id: str, job: PersistJob) -> None:
        self._watched.discard(checkpoint_id)
        opened = self.opened
        if job.answer is None or opened.id != checkpoint_id or opened.phase is not Phase.CAPTURED:
            return  # failed, or aborted meanwhile: the abort reopened it
        opened.move(
            Phase.FINAL, f"final checkpoint {checkpoint_id} persisted: admission closed until the process exits"
        )
        self.termination.persisted(checkpoint_id)
        self.metrics.final_checkpoints.labels(outcome="persisted").inc()

    def expired(self, checkpoint_id: str) -> None:
        """The lease of a final checkpoint this server persisted ran out: the process ends (never resumes)."""
        if self.termination.exit_due() is None:
            log.warning(
                "final checkpoint held past its lease: exiting (a restore continues from it)",
                extra={"checkpoint_id": checkpoint_id},
            )
        self.termination.request_exit(ExitReason.FINAL_HELD)

    def aborted(self, checkpoint_id: str) -> None:
        """A final checkpoint was aborted (its publish failed): this server no longer holds it."""
        if self.termination.final_checkpoint_id == checkpoint_id:
            self.termination.final_checkpoint_id = None
        self.metrics.final_checkpoints.labels(outcome="aborted").inc()
