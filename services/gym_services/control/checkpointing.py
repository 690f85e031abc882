"""The checkpoint verbs of one server's control plane: ``prepare``, ``capture``, ``persist``.

``prepare`` closes admission and waits until nothing blocks a boundary (or the deadline); a server whose declared
mode would lose what it holds is refused first, before anything pauses. ``capture`` takes, under the pause, an
immutable capture of the checkpoint's scope and reports the sessions the scope did not keep by their rollout
(``docs/protocol.md``, "Scope"); ``persist`` writes it, in the background (:mod:`.persists`), and answers once it is
written and verified: under the pause (the ``sync`` method) or after ``resume`` (:mod:`.closing`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Generic

from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.control.admission import Admission
from gym_services.control.encoding import HeapHold
from gym_services.control.final import FinalHold
from gym_services.control.gc_pause import collection_paused
from gym_services.control.models import (
    Blocker,
    CaptureRequest,
    CaptureResponse,
    CheckpointRef,
    PersistResponse,
    PrepareRequest,
    PrepareResponse,
)
from gym_services.control.open_checkpoint import OpenCheckpoint
from gym_services.control.participant import F, InvalidState, Participant, Scope, V
from gym_services.control.persists import PendingCapture, PersistJob, Persists
from gym_services.control.protocol import Phase, Verb
from gym_services.control.storage_clients import StorageClients
from gym_services.control.store import CheckpointStore

log = get_logger("control")


class Checkpointing(Generic[V, F]):
    def __init__(
        self,
        config: ServerConfig,
        participant: Participant[V, F],
        admission: Admission,
        opened: OpenCheckpoint[V, F],
        storages: StorageClients,
        persists: Persists[F],
        final: FinalHold[V, F],
    ) -> None:
        self.config = config
        self.participant = participant
        self.admission = admission
        self.opened = opened
        self.storages = storages
        self.persists = persists
        self.final = final

    def blockers(self) -> list[Blocker]:
        """What keeps this server from a boundary now: its gated requests in flight, and its participant's."""
        return self.admission.blocking() + self.participant.blockers()

    # --- prepare -----------------------------------------------------------------------

    async def prepare(self, req: PrepareRequest) -> PrepareResponse:
        cid = req.checkpoint_id
        opened = self.opened
        if not opened.calls.started(Verb.PREPARE, cid):
            opened.refuse_busy(Verb.PREPARE, cid)
            self._refuse_persisting(cid)
            self._refuse_mode(cid)
            opened.open(cid, req.lease_s, Phase.PREPARING, f"prepare {cid}: admission closed")
            self.final.begin(cid, bool(req.final))
        return await opened.once(Verb.PREPARE, cid, lambda: self._run_prepare(req))

    async def _run_prepare(self, req: PrepareRequest) -> PrepareResponse:
        cid = req.checkpoint_id
        started = time.monotonic()
        await self.participant.prepare(cid)
        blockers = await self._wait_for_boundary(cid, started + req.deadline_s)
        status = Phase.BLOCKED if blockers else Phase.PREPARED
        self.opened.move(status, f"prepare {cid}: {status}" + (f" ({len(blockers)} blockers)" if blockers else ""))
        return PrepareResponse(
            checkpoint_id=cid,
            participant_id=self.opened.participant_id,
            role=self.opened.role,
            status=status,
            blockers=blockers,
            waited_s=round(time.monotonic() - started, 6),
            final=True if self.opened.final else None,
        )

    async def _wait_for_boundary(self, cid: str, deadline: float) -> list[Blocker]:
        """Poll the blockers until there are none or the deadline passes; what is left blocks."""
        poll = self.config.checkpoint.poll_interval_s
        while True:
            if self.opened.id != cid:
                raise ApiError(ErrorCode.UNKNOWN_CHECKPOINT, f"checkpoint {cid} was aborted while preparing")
            blockers = self.blockers()
            now = time.monotonic()
            if not blockers or now >= deadline:
                return blockers
            await asyncio.sleep(min(poll, max(0.0, deadline - now)))

    def _refuse_persisting(self, cid: str) -> None:
        job = self.persists.running()
        if job is not None:
            raise ApiError(
                ErrorCode.CHECKPOINT_BUSY,
                f"checkpoint {job.checkpoint_id} is still being written on {self.opened.participant_id} "
                f"({job.progress.encoded}/{job.records} records encoded); cannot prepare {cid} until it is persisted",
                details={"persisting_checkpoint_id": job.checkpoint_id},
            )

    def _refuse_mode(self, cid: str) -> None:
        """``422 invalid_state`` before anything pauses when the server's declared mode would lose what it holds."""
        conflict = self.participant.mode_conflict()
        if conflict is not None:
            mode = self.participant.checkpoint_mode
            raise ApiError(
                ErrorCode.INVALID_STATE,
                f"prepare {cid} refused: server {self.config.name} ({self.opened.participant_id}) declares "
                f"checkpoint_mode {mode}, but {conflict}",
                details={"server": self.config.name, "checkpoint_mode": mode},
            )

    # --- capture and persist ------------------------------------------------------------

    async def capture(self, req: CaptureRequest) -> CaptureResponse:
        """Under the pause: an immutable capture of the scope; ``persist`` writes it (before or after resume)."""
        cid = req.checkpoint_id
        opened = self.opened
        if not opened.calls.started(Verb.CAPTURE, cid):
            opened.require(cid)
            if opened.phase != Phase.PREPARED:
                raise ApiError(
                    ErrorCode.INVALID_PHASE,
                    f"capture needs a prepared checkpoint; {opened.participant_id} is {opened.phase}",
                )
        return await opened.once(Verb.CAPTURE, cid, lambda: self._run_capture(req))

    async def _run_capture(self, req: CaptureRequest) -> CaptureResponse:
        started = time.perf_counter()
        opened = self.opened
        opened.lease.renew()
        if req.final and not opened.final:
            self.final.begin(req.checkpoint_id, True)  # it became final after this server prepared it
        # a bad location fails now, under the pause; a new S3 client is built off the event loop (it takes the
        # CPU for a while, and the loop serves the lease renewals and the other verbs meanwhile)
        storage = await asyncio.to_thread(self.storages.get, req.location, req.storage)
        scope = Scope.of(req.episodes, final=opened.final)
        try:
            with collection_paused():
                capture = await self.participant.capture(scope)
                capture = capture.with_attempts(self.admission.fence.highest)
                heap = HeapHold()  # until the persist ends or the capture is dropped (see collection_paused)
        except InvalidState as exc:
            raise ApiError(
                ErrorCode.INVALID_STATE, f"capture for checkpoint {req.checkpoint_id} failed: {exc}"
            ) from None
        try:
            await self.participant.release_out_of_scope(scope)
        except BaseException:
            heap.release()
            raise
        opened.captured = PendingCapture(req.checkpoint_id, CheckpointStore(storage), capture, heap)
        opened.move(Phase.CAPTURED, f"capture {req.checkpoint_id}: {len(capture)} records, written after resume")
        if capture.scope.dropped_total:
            log.warning(
                "sessions left out of the checkpoint: their rollouts are not among its episodes",
                extra={"checkpoint_id": req.checkpoint_id, "dropped": capture.scope.dropped_total},
            )
        return CaptureResponse(
            checkpoint_id=req.checkpoint_id,
            participant_id=opened.participant_id,
            role=opened.role,
            records=len(capture),
            episodes=capture.episodes,
            duration_s=round(time.perf_counter() - started, 6),
            scope=capture.scope,
        )

    async def persist(self, req: CheckpointRef) -> PersistResponse:
        """Start (if queued) and wait for the background upload of a captured checkpoint; its participant
        manifest once verified."""
        cid = req.checkpoint_id
        opened = self.opened
        if opened.id == cid and opened.phase is Phase.CAPTURED and opened.captured is not None:
            if opened.persisting is None:  # under the pause (sync): resume finds it started
                opened.persisting = self.persists.start(opened.captured)
            if opened.final:
                self.final.watch(cid, opened.persisting)  # written: held in phase final until exit
            job: PersistJob | None = opened.persisting
        else:
            job = self.persists.get(cid)
        if job is None:
            raise ApiError(
                ErrorCode.UNKNOWN_CHECKPOINT, f"checkpoint {cid} was never captured on {opened.participant_id}"
            )
        job.begin()
        return await job.wait()
