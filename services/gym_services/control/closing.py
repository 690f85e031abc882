"""``resume`` and ``abort``: how one server's control plane closes the open checkpoint or restore.

Resume delivers held work, reopens admission and queues the upload of a capture (:mod:`.persists`); abort (or a
resume of a checkpoint that never reached a boundary) abandons it: the capture is dropped and its upload cancelled,
a restore undone. Both are also what the lease expiry of the control plane (:mod:`.plane`) runs when the
coordinator went quiet. A repeat gets the first answer (:mod:`.repeats`). A final checkpoint is never resumed
(:mod:`.final`): its ``resume`` holds it, and an abort reopens it.
"""

from __future__ import annotations

from typing import Generic

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.control.final import FinalHold
from gym_services.control.models import PhaseResponse
from gym_services.control.open_checkpoint import OpenCheckpoint
from gym_services.control.participant import F, Participant, V
from gym_services.control.persists import Persists
from gym_services.control.protocol import Phase, Verb


class Closing(Generic[V, F]):
    def __init__(
        self,
        participant: Participant[V, F],
        opened: OpenCheckpoint[V, F],
        persists: Persists[F],
        final: FinalHold[V, F],
    ) -> None:
        self.participant = participant
        self.opened = opened
        self.persists = persists
        self.final = final

    async def finish(self, verb: Verb, cid: str) -> PhaseResponse:
        """``resume`` or ``abort`` of checkpoint ``cid``, once."""
        opened = self.opened
        if verb is Verb.ABORT and opened.id != cid and (job := self.persists.cancel(cid)) is not None:
            # resumed already: abandon its background upload, so its manifest is never written
            return opened.response(f"abort {cid}: background upload {job.state}", cid)
        if opened.id is None and (closed := opened.calls.closed(cid)) is not None:
            return closed  # idempotent repeat
        opened.require(cid)
        running = opened.calls.busy(cid, (Verb.CAPTURE, Verb.RESTORE))
        if running:
            raise ApiError(ErrorCode.CHECKPOINT_BUSY, f"{verb} must wait: a {running[0].get_name()} is still running")
        return await opened.once(verb, cid, lambda: self.run(verb, cid))

    async def run(self, verb: Verb, cid: str) -> PhaseResponse:
        """Close the open checkpoint now (the lease expiry calls this directly)."""
        opened = self.opened
        if verb is Verb.RESUME and opened.final and opened.phase in (Phase.CAPTURED, Phase.FINAL):
            return self.final.hold(cid)
        restore = opened.restoring
        abandon = verb is Verb.ABORT or opened.phase in (Phase.PREPARING, Phase.BLOCKED)
        if abandon and opened.final:
            self.final.aborted(cid)
        if abandon and restore is not None and restore.validated is not None:
            await self.participant.uninstall(restore.validated)
        if abandon:
            await self.participant.abort()
        else:
            await self.participant.resume()
            if restore is not None and restore.decision is not None and restore.answer is not None:
                opened.calls.remember_resumed_restore(cid, restore.decision[1], restore.answer)
        captured = opened.captured if opened.phase in (Phase.CAPTURED, Phase.FINAL) else None
        undone = restore is not None and abandon
        phase = restore.before if undone and restore is not None else Phase.OPEN
        note = " (restore undone)" if undone else ""
        started = opened.persisting if captured is not None else None
        if captured is not None:
            written = "written under the pause" if started is not None else "being written"
            note = " (capture dropped)" if abandon else f"; {len(captured.capture)} records {written}"
        if started is not None and abandon:
            self.persists.cancel(cid)  # persisted under the pause, then aborted: its manifest is never written
        if captured is not None and abandon and started is None:
            captured.release()  # dropped: no persist will
        response = opened.close(verb, f"{verb} {cid}: admission open{note}", phase)
        if captured is not None and not abandon and started is None:
            self.persists.start(captured)
        return response
