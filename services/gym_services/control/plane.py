"""The checkpoint control plane of one server: the control verbs, over a few collaborators.

Built by the app factory (:func:`gym_services.server.app.create_server_app`) for every server and
called by its control routes (:mod:`gym_services.control.routes`). It answers each verb and
delegates the rest: phases and their allowed moves (:mod:`.phases`), admission and the attempt
fence (:mod:`.admission`), the lease and its watcher (:mod:`.lease`), repeat calls
(:mod:`.repeats`), storage clients (:mod:`.storage_clients`), records and manifests
(:mod:`.records`), restore decisions (:mod:`.decisions`); what depends on the server's own state
is its :class:`~gym_services.control.participant.Participant`'s business; background uploads of
captured checkpoints are :mod:`.persists`'.

Phases: ``open -> preparing -> prepared|blocked -> captured -> open`` (resume) or
``-> open`` (abort); a fresh process: ``fresh -> restoring -> restored -> open``
(``docs/protocol.md``). ``persist`` writes what ``capture`` took, in the background, and answers
once it is written and verified: under the pause (the ``sync`` method) or after ``resume``.
Every verb is idempotent for the same checkpoint id: a repeat returns the first answer (or waits
for the first call still running).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.control.admission import Admission
from gym_services.control.encoding import HeapHold
from gym_services.control.lease import Lease
from gym_services.control.metrics import ControlMetrics
from gym_services.control.models import (
    Blocker,
    CaptureRequest,
    CaptureResponse,
    CheckpointRef,
    PersistResponse,
    PhaseResponse,
    PrepareRequest,
    PrepareResponse,
    RestoreRequest,
    RestoreResponse,
    RetireRequest,
    RetireResponse,
    StatusResponse,
)
from gym_services.control.packs import PackWriter
from gym_services.control.participant import F, InvalidState, Participant, RestoredRecord, Scope, V
from gym_services.control.persists import PendingCapture, PersistJob, Persists
from gym_services.control.phases import PhaseMachine
from gym_services.control.protocol import OPEN_PHASES, Decision, Phase, Verb
from gym_services.control.records import IncompleteCheckpoint, ReadBack, read_participant_records
from gym_services.control.repeats import RepeatCalls
from gym_services.control.storage import StorageError
from gym_services.control.storage_clients import StorageClients
from gym_services.control.store import CheckpointStore

T = TypeVar("T")
log = get_logger("control")


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection while a capture runs under the pause, or a restore reads and validates.

    A capture allocates a few small objects per session; with thousands of sessions that triggers full
    collections over every live object of the server (its sessions' tables), which measured ~40% of a
    4,000-session capture. A restore keeps every session it rebuilds (pandas frames, indexes), so each
    collection it triggers walks all it rebuilt so far: ~40% of decoding 10,000 Workplace sessions (issue 29).
    Collection resumes once the capture or the restore's validation is done; what either allocates meanwhile is
    bounded by its sessions. No server call runs meanwhile (admission is closed).

    A capture also freezes the heap (a :class:`~gym_services.control.encoding.HeapHold`, taken inside this block,
    before collection is back on) until its persist ends or it is dropped: otherwise, when the capture's objects
    tip CPython into a full collection (they are ~3 per session, the margin a quarter of the heap), it comes in
    the first second after resume, as the parked calls retry, and walks every object of the server: ~200 ms at
    10,000 sessions (issue 29, ``benchmarks/gc_resume.py``). What is made after the freeze is still collected.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class RestoreInProgress(Generic[V]):
    """A restore from its start until the checkpoint closes."""

    before: Phase  # where the process was: an undone restore goes back there
    decision: tuple[CheckpointStore, str] | None = None  # where its decision object is, when the coordinator named it
    validated: V | None = None  # what the participant validated and installed
    answer: RestoreResponse | None = None


class ControlPlane(Generic[V, F]):
    def __init__(
        self,
        config: ServerConfig,
        participant: Participant[V, F],
        metrics: ControlMetrics,
        admission: Admission,
    ) -> None:
        self.config = config
        self.server = config.name
        self.participant_id = config.participant_id
        self.participant = participant
        self.role = participant.role
        self.metrics = metrics
        self.admission = admission
        self.phases = PhaseMachine(admission, metrics.admission_open)
        self._lease = Lease()
        self.calls = RepeatCalls()
        self.storages = StorageClients(config.storage, self.server)
        writer = PackWriter(
            participant_id=self.participant_id,
            server=self.server,
            role=self.role,
            mode=participant.checkpoint_mode,
            verify=participant.checkpoint_verify,
            pool=self.storages.pool,
            encoder=participant.encoder,
            pack_bytes=config.checkpoint.pack_bytes,
        )
        self.persists = Persists(writer, metrics)
        self.checkpoint_id: str | None = None
        self.restoring: RestoreInProgress[V] | None = None
        self.captured: PendingCapture[F] | None = None  # a capture waiting for resume
        self.persisting: PersistJob | None = None  # its upload, when ``persist`` came before resume

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self.storages.warm)  # boto3 client made now, never under a checkpoint's pause
        self._lease.watch(self._expire_if_due, self.config.checkpoint.lease_check_interval_s, f"lease-{self.server}")

    async def stop(self) -> None:
        await self._lease.stop()
        if self.captured is not None:
            self.captured.release()  # (a persist started releases it too: release is idempotent)
        self.calls.cancel_all()
        self.persists.cancel_all()
        self.storages.shutdown()

    # --- what the rest of the server reads -------------------------------------------

    @property
    def phase(self) -> Phase:
        return self.phases.phase

    def current_blockers(self) -> list[Blocker]:
        return self.admission.blocking() + self.participant.blockers()

    # --- helpers ---------------------------------------------------------------------

    def _move(self, phase: Phase, event: str) -> None:
        self.phases.move(phase, event, self.checkpoint_id)

    def _phase_response(self, detail: str = "", checkpoint_id: str | None = None) -> PhaseResponse:
        return PhaseResponse(
            checkpoint_id=checkpoint_id or self.checkpoint_id,
            participant_id=self.participant_id,
            role=self.role,
            phase=self.phase,
            detail=detail,
        )

    def _require_open_checkpoint(self, checkpoint_id: str) -> None:
        if self.checkpoint_id is None:
            raise ApiError(ErrorCode.UNKNOWN_CHECKPOINT, f"no checkpoint is open on {self.participant_id}")
        if checkpoint_id != self.checkpoint_id:
            raise ApiError(
                ErrorCode.UNKNOWN_CHECKPOINT,
                f"checkpoint {checkpoint_id} is not the open one ({self.checkpoint_id}) on {self.participant_id}",
            )

    def _refuse_busy(self, verb: Verb, cid: str) -> None:
        if self.checkpoint_id is not None:
            raise ApiError(
                ErrorCode.CHECKPOINT_BUSY,
                f"checkpoint {self.checkpoint_id} is open on {self.participant_id} (phase {self.phase}); "
                f"cannot {verb} {cid}",
                details={"open_checkpoint_id": self.checkpoint_id, "phase": self.phase},
            )

    async def _once(self, verb: Verb, checkpoint_id: str, work: Callable[[], Awaitable[T]]) -> T:
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

    def _open(self, cid: str, lease_s: float, phase: Phase, event: str) -> None:
        """A checkpoint (or restore) starts here: admission closes, the lease runs."""
        self.calls.opened(cid)
        self.checkpoint_id = cid
        self._lease.renew(lease_s)
        self._move(phase, event)

    def _close(self, verb: Verb, event: str, phase: Phase) -> PhaseResponse:
        """End the open checkpoint: admission reopens, per-checkpoint calls are dropped."""
        checkpoint_id = self.checkpoint_id
        assert checkpoint_id is not None
        self.checkpoint_id = None
        self._move(phase, event)
        self._lease.clear()
        self.restoring = None
        self.captured = None
        self.persisting = None
        response = self._phase_response(event, checkpoint_id)
        self.calls.close(checkpoint_id, verb, response)
        return response

    # --- status ------------------------------------------------------------------------

    def status(self) -> StatusResponse:
        return StatusResponse(
            participant_id=self.participant_id,
            server=self.server,
            role=self.role,
            checkpoint_mode=self.participant.checkpoint_mode,
            checkpoint_verify=self.participant.checkpoint_verify,
            phase=self.phase,
            checkpoint_id=self.checkpoint_id,
            lease_remaining_s=self._lease.remaining(),
            admission_open=self.admission.is_open,
            inflight=len(self.admission.inflight),
            live=self.participant.live(),
            blockers=self.current_blockers(),
            last_event=self.phases.last_event,
            persist=job.status() if (job := self.persists.newest()) is not None else None,
        )

    # --- prepare -----------------------------------------------------------------------

    async def prepare(self, req: PrepareRequest) -> PrepareResponse:
        cid = req.checkpoint_id
        if not self.calls.started(Verb.PREPARE, cid):
            self._refuse_busy(Verb.PREPARE, cid)
            self._refuse_persisting(cid)
            self._open(cid, req.lease_s, Phase.PREPARING, f"prepare {cid}: admission closed")
        return await self._once(Verb.PREPARE, cid, lambda: self._run_prepare(req))

    async def _run_prepare(self, req: PrepareRequest) -> PrepareResponse:
        cid = req.checkpoint_id
        started = time.monotonic()
        await self.participant.prepare(cid)
        blockers = await self._wait_for_boundary(cid, started + req.deadline_s)
        status = Phase.BLOCKED if blockers else Phase.PREPARED
        self._move(status, f"prepare {cid}: {status}" + (f" ({len(blockers)} blockers)" if blockers else ""))
        return PrepareResponse(
            checkpoint_id=cid,
            participant_id=self.participant_id,
            role=self.role,
            status=status,
            blockers=blockers,
            waited_s=round(time.monotonic() - started, 6),
        )

    async def _wait_for_boundary(self, cid: str, deadline: float) -> list[Blocker]:
        """Poll the blockers until there are none or the deadline passes; what is left blocks."""
        poll = self.config.checkpoint.poll_interval_s
        while True:
            if self.checkpoint_id != cid:
                raise ApiError(ErrorCode.UNKNOWN_CHECKPOINT, f"checkpoint {cid} was aborted while preparing")
            blockers = self.current_blockers()
            now = time.monotonic()
            if not blockers or now >= deadline:
                return blockers
            await asyncio.sleep(min(poll, max(0.0, deadline - now)))

    def _refuse_persisting(self, cid: str) -> None:
        job = self.persists.running()
        if job is not None:
            raise ApiError(
                ErrorCode.CHECKPOINT_BUSY,
                f"checkpoint {job.checkpoint_id} is still being written on {self.participant_id} "
                f"({job.progress.encoded}/{job.records} records encoded); cannot prepare {cid} until it is persisted",
                details={"persisting_checkpoint_id": job.checkpoint_id},
            )

    # --- capture and persist ------------------------------------------------------------------

    async def capture(self, req: CaptureRequest) -> CaptureResponse:
        """Under the pause: an immutable snapshot of the scope; ``persist`` writes it (before or after resume)."""
        cid = req.checkpoint_id
        if not self.calls.started(Verb.CAPTURE, cid):
            self._require_open_checkpoint(cid)
            if self.phase != Phase.PREPARED:
                raise ApiError(
                    ErrorCode.INVALID_PHASE,
                    f"capture needs a prepared checkpoint; {self.participant_id} is {self.phase}",
                )
        return await self._once(Verb.CAPTURE, cid, lambda: self._run_capture(req))

    async def _run_capture(self, req: CaptureRequest) -> CaptureResponse:
        started = time.perf_counter()
        self._lease.renew()
        # a bad location fails now, under the pause; a new S3 client is built off the event loop (it takes the
        # CPU for a while, and the loop serves the lease renewals and the other verbs meanwhile)
        storage = await asyncio.to_thread(self.storages.get, req.location, req.storage)
        scope = Scope.of(req.episodes)
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
        self.captured = PendingCapture(req.checkpoint_id, CheckpointStore(storage), capture, heap)
        self._move(Phase.CAPTURED, f"capture {req.checkpoint_id}: {len(capture)} records, written after resume")
        return CaptureResponse(
            checkpoint_id=req.checkpoint_id,
            participant_id=self.participant_id,
            role=self.role,
            records=len(capture),
            episodes=capture.episodes,
            duration_s=round(time.perf_counter() - started, 6),
        )

    def _start_persist(self, captured: PendingCapture[F]) -> PersistJob:
        """Queue the encoding, packing and upload of a capture (``persist`` starts them)."""
        return self.persists.start(captured)

    async def persist(self, req: CheckpointRef) -> PersistResponse:
        """Start (if queued) and wait for the background upload of a captured checkpoint; its participant
        manifest once verified."""
        cid = req.checkpoint_id
        if self.checkpoint_id == cid and self.phase is Phase.CAPTURED and self.captured is not None:
            if self.persisting is None:  # under the pause (sync): resume finds it started
                self.persisting = self._start_persist(self.captured)
            job: PersistJob | None = self.persisting
        else:
            job = self.persists.get(cid)
        if job is None:
            raise ApiError(
                ErrorCode.UNKNOWN_CHECKPOINT, f"checkpoint {cid} was never captured on {self.participant_id}"
            )
        job.begin()
        return await job.wait()

    # --- resume and abort --------------------------------------------------------------

    async def resume(self, req: CheckpointRef) -> PhaseResponse:
        return await self._finish(Verb.RESUME, req.checkpoint_id)

    async def abort(self, req: CheckpointRef) -> PhaseResponse:
        return await self._finish(Verb.ABORT, req.checkpoint_id)

    async def _finish(self, verb: Verb, cid: str) -> PhaseResponse:
        if verb is Verb.ABORT and self.checkpoint_id != cid and (job := self.persists.cancel(cid)) is not None:
            # resumed already: abandon its background upload, so its manifest is never written
            return self._phase_response(f"abort {cid}: background upload {job.state}", cid)
        if self.checkpoint_id is None and (closed := self.calls.closed(cid)) is not None:
            return closed  # idempotent repeat
        self._require_open_checkpoint(cid)
        running = self.calls.busy(cid, (Verb.CAPTURE, Verb.RESTORE))
        if running:
            raise ApiError(ErrorCode.CHECKPOINT_BUSY, f"{verb} must wait: a {running[0].get_name()} is still running")
        return await self._once(verb, cid, lambda: self._run_finish(verb, cid))

    async def _run_finish(self, verb: Verb, cid: str) -> PhaseResponse:
        restore = self.restoring
        abandon = verb is Verb.ABORT or self.phase in (Phase.PREPARING, Phase.BLOCKED)
        if abandon and restore is not None and restore.validated is not None:
            await self.participant.uninstall(restore.validated)
        if abandon:
            await self.participant.abort()
        else:
            await self.participant.resume()
            if restore is not None and restore.decision is not None and restore.answer is not None:
                self.calls.remember_resumed_restore(cid, restore.decision[1], restore.answer)
        captured = self.captured if self.phase is Phase.CAPTURED and self.captured is not None else None
        undone = restore is not None and abandon
        phase = restore.before if undone and restore is not None else Phase.OPEN
        note = " (restore undone)" if undone else ""
        started = self.persisting if captured is not None else None
        if captured is not None:
            written = "written under the pause" if started is not None else "being written"
            note = " (capture dropped)" if abandon else f"; {len(captured.capture)} records {written}"
        if started is not None and abandon:
            self.persists.cancel(cid)  # persisted under the pause, then aborted: its manifest is never written
        if captured is not None and abandon and started is None:
            captured.release()  # dropped: no persist will
        response = self._close(verb, f"{verb} {cid}: admission open{note}", phase)
        if captured is not None and not abandon and started is None:
            self._start_persist(captured)
        return response

    # --- restore -----------------------------------------------------------------------

    async def restore(self, req: RestoreRequest) -> RestoreResponse:
        cid = req.checkpoint_id
        done = self.calls.resumed_restore(cid, req.restore_id)
        if done is not None and self.checkpoint_id is None:
            return done  # a re-run coordinator repeats a restore this process already finished
        if not self.calls.started(Verb.RESTORE, cid):
            self._refuse_busy(Verb.RESTORE, cid)
            if self.phase not in OPEN_PHASES:
                raise ApiError(ErrorCode.INVALID_PHASE, f"{self.participant_id} cannot restore in phase {self.phase}")
            self.restoring = RestoreInProgress(before=self.phase)
            self._open(cid, req.lease_s, Phase.RESTORING, f"restore {cid}: admission closed")
        return await self._once(Verb.RESTORE, cid, lambda: self._run_restore(req))

    async def _run_restore(self, req: RestoreRequest) -> RestoreResponse:
        started = time.perf_counter()
        restore = self.restoring
        assert restore is not None
        try:
            store = CheckpointStore(await asyncio.to_thread(self.storages.get, req.location, req.storage))
            restore.decision = (store, req.restore_id) if req.restore_id else None
            with collection_paused():  # a restore allocates per record as a capture does per session (issue 29)
                read = await self._read_records(store, req)
                records = read.records
                validated = await self.participant.validate(records)
        except InvalidState as exc:
            self._abandon_restore(f"restore {req.checkpoint_id} refused: {exc}")
            raise ApiError(ErrorCode.INVALID_STATE, str(exc)) from None
        except BaseException:
            self._abandon_restore(f"restore {req.checkpoint_id} failed")
            raise
        await self.participant.install(validated)
        restore.validated = validated
        self.persists.remember(store, read.reuse)  # the next checkpoint may reference these records
        episodes = self._advance_fence(records)
        total = sum(len(r.data) for r in records)
        self.metrics.records_restored.inc(len(records))
        self.metrics.bytes_restored.inc(total)
        self._lease.renew()
        self._move(Phase.RESTORED, f"restore {req.checkpoint_id}: {len(records)} records installed")
        restore.answer = RestoreResponse(
            checkpoint_id=req.checkpoint_id,
            participant_id=self.participant_id,
            role=self.role,
            records=len(records),
            bytes=total,
            episodes=episodes,
            duration_s=round(time.perf_counter() - started, 6),
        )
        return restore.answer

    async def _read_records(self, store: CheckpointStore, req: RestoreRequest) -> ReadBack:
        """This participant's records, each verified against its manifest, which must be its own."""
        try:
            read = await read_participant_records(
                store, self.storages.pool, req.checkpoint_id, req.manifest_key, req.manifest_sha256
            )
            manifest = read.manifest
        except IncompleteCheckpoint as exc:
            raise ApiError(
                ErrorCode.UNKNOWN_CHECKPOINT, f"checkpoint {req.checkpoint_id} is incomplete: {exc}"
            ) from None
        except StorageError as exc:
            raise ApiError(
                ErrorCode.STORAGE_UNAVAILABLE, f"reading checkpoint {req.checkpoint_id} failed: {exc}"
            ) from None
        if manifest.checkpoint_id != req.checkpoint_id:
            raise InvalidState(f"manifest belongs to checkpoint {manifest.checkpoint_id}, not {req.checkpoint_id}")
        if manifest.participant_id != self.participant_id or manifest.role != self.role:
            raise InvalidState(
                f"manifest is for {manifest.role} {manifest.participant_id}, this is {self.role} {self.participant_id}"
            )
        return read

    def _advance_fence(self, records: list[RestoredRecord]) -> dict[str, int]:
        """Restored episodes continue as attempt + 1: older attempts are stale from now on."""
        episodes: dict[str, int] = {}
        for record in records:
            if record.rollout_id is not None and record.new_attempt is not None:
                self.admission.fence.advance(record.rollout_id, record.new_attempt)
                episodes[record.rollout_id] = max(episodes.get(record.rollout_id, 0), record.new_attempt)
        return episodes

    def _abandon_restore(self, event: str) -> None:
        """A failed restore installed nothing: go back to where we were."""
        if self.phase is not Phase.RESTORING:
            return  # already closed (the server is stopping)
        before = self.restoring.before if self.restoring is not None else Phase.FRESH
        self.checkpoint_id = None
        self._lease.clear()
        self.restoring = None
        self._move(before, event)

    # --- lease and retire ----------------------------------------------------------------

    async def lease(self, req: CheckpointRef) -> PhaseResponse:
        self._require_open_checkpoint(req.checkpoint_id)
        self._lease.renew()
        return self._phase_response("lease renewed")

    async def retire(self, req: RetireRequest) -> RetireResponse:
        if self.checkpoint_id is not None:
            raise ApiError(
                ErrorCode.CHECKPOINT_BUSY,
                f"retire is refused while checkpoint {self.checkpoint_id} is open on {self.participant_id}",
            )
        retired = await self.participant.retire(req.rollout_id, req.attempt)
        self.admission.fence.advance(req.rollout_id, req.attempt + 1)
        log.info("retired", extra={"rollout_id": req.rollout_id, "attempt": req.attempt, "dropped": retired})
        return RetireResponse(
            rollout_id=req.rollout_id, attempt=req.attempt, participant_id=self.participant_id, retired=retired
        )

    # --- lease expiry --------------------------------------------------------------------

    async def _expire_if_due(self) -> None:
        """The watcher's check: a lease nobody renewed aborts the checkpoint, or settles a restore."""
        cid = self.checkpoint_id
        if cid is None or not self._lease.expired():
            return
        if self.calls.busy(cid, (Verb.CAPTURE, Verb.RESTORE)):
            return  # bounded work in progress; expire once it ends
        restore = self.restoring
        if self.phase == Phase.RESTORED and restore is not None and restore.decision is not None:
            await self._expire_restore(cid, *restore.decision)
            return
        log.warning("lease expired: aborting checkpoint by itself", extra={"checkpoint_id": cid, "phase": self.phase})
        self.metrics.lease_expiries.inc()
        prepare = self.calls.task(Verb.PREPARE, cid)
        if prepare is not None and not prepare.done():
            prepare.cancel()
        await self._run_finish(Verb.ABORT, cid)
        self.phases.last_event = f"lease expired: checkpoint {cid} aborted, admission open"

    async def _expire_restore(self, cid: str, store: CheckpointStore, restore_id: str) -> None:
        """The coordinator went quiet after this restore: follow the restore's decision object.

        Proposing ``abort`` either decides it (the coordinator had not decided yet, and will
        now abort everyone) or reads the ``resume`` the coordinator wrote before it died. If
        storage cannot be reached the restore stays closed and is retried each tick, for one more
        lease at most; then it is undone, and that is logged as an error.
        """
        try:
            decision = await asyncio.to_thread(store.settle, cid, restore_id, Decision.ABORT, self.participant_id)
        except (StorageError, InvalidState) as exc:
            if not self._lease.overdue_by_a_lease():
                log.warning(
                    "lease expired; the restore decision cannot be read yet",
                    extra={"checkpoint_id": cid, "error": str(exc)},
                )
                return
            log.error(
                "the restore decision stayed unreadable: undoing the restore",
                extra={"checkpoint_id": cid, "error": str(exc)},
            )
            decision = Decision.ABORT
        if self.checkpoint_id != cid or self.phase != Phase.RESTORED:
            return  # the coordinator closed it meanwhile
        log.warning(
            f"lease expired after restore {restore_id}: following its decision ({decision})",
            extra={"checkpoint_id": cid, "restore_id": restore_id},
        )
        self.metrics.restore_decisions.labels(decision=decision).inc()
        finish = Verb(decision)
        await self._once(finish, cid, lambda: self._run_finish(finish, cid))
        verb = "resumed" if decision == Decision.RESUME else "undone"
        self.phases.last_event = (
            f"lease expired: restore {restore_id} of checkpoint {cid} {verb} as decided, admission open"
        )
