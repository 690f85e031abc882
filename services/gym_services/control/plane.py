"""The checkpoint control plane of one server: phases, admission, fencing, lease, storage.

Phases (DESIGN §5): ``open -> preparing -> prepared|blocked -> committed -> open`` (resume)
or ``-> open`` (abort); a fresh process: ``fresh -> restoring -> restored -> open``.
Every verb is idempotent for the same checkpoint id: a repeat returns the first answer
(or waits for the first call still running).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.control.admission import Admission
from gym_services.control.fencing import AttemptFence
from gym_services.control.metrics import ControlMetrics
from gym_services.control.models import (
    Blocker,
    CheckpointRef,
    CommitRequest,
    CommitResponse,
    PhaseResponse,
    PrepareRequest,
    PrepareResponse,
    RestoreRequest,
    RestoreResponse,
    RetireRequest,
    RetireResponse,
    StatusResponse,
    StorageAccess,
)
from gym_services.control.decisions import settle
from gym_services.control.protocol import DEFAULT_LEASE_S, OPEN_PHASES, Decision, Phase, Verb
from gym_services.control.participant import InvalidState, Participant, Scope
from gym_services.control.records import (
    IncompleteCheckpoint,
    read_participant_checkpoint,
    sha256,
    write_participant_checkpoint,
)
from gym_services.control.storage import Storage, StorageError, open_storage

T = TypeVar("T")
log = get_logger("control")


class ControlPlane:
    def __init__(
        self,
        config: ServerConfig,
        participant: Participant,
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
        self.phase: Phase = Phase.FRESH
        self.checkpoint_id: str | None = None
        self.lease_deadline: float | None = None
        self._lease_s = DEFAULT_LEASE_S
        self.last_event: str | None = None
        self._ops: dict[tuple[Verb, str], asyncio.Task] = {}
        self._closed: dict[str, tuple[Verb, PhaseResponse]] = {}
        self._restored: Any = None
        self._phase_before_restore: Phase = Phase.FRESH
        #: (storage, restore id) of the restore in progress, when the coordinator named it
        self._decision: tuple[Storage, str] | None = None
        self._restore_answer: RestoreResponse | None = None
        #: restores this process installed and resumed: checkpoint id -> (restore id, answer)
        self._resumed_restores: dict[str, tuple[str, RestoreResponse]] = {}
        #: one client per location and access (the access's values, keys included, tell clients apart)
        self._storages: dict[tuple[str, tuple[tuple[str, str], ...]], Storage] = {}
        self._pool = ThreadPoolExecutor(
            max_workers=config.storage.max_concurrency, thread_name_prefix=f"storage-{self.server}"
        )
        self._lease_task: asyncio.Task | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._lease_task = asyncio.create_task(self._watch_lease(), name=f"lease-{self.server}")

    async def stop(self) -> None:
        if self._lease_task:
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lease_task
        for task in self._ops.values():
            task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- helpers ---------------------------------------------------------------------

    @property
    def fence(self) -> AttemptFence:
        return self.admission.fence

    def _set_phase(self, phase: Phase, event: str) -> None:
        self.phase = phase
        self.admission.set(phase in OPEN_PHASES, self.checkpoint_id, phase)
        self.metrics.admission_open.set(1 if self.admission.is_open else 0)
        self.last_event = event
        log.info(event, extra={"phase": phase, "checkpoint_id": self.checkpoint_id})

    def storage(self, location: str, access: StorageAccess | None = None) -> Storage:
        """The storage client for a location, from the server's config or the request's access."""
        key = (location, tuple(sorted(access.wire().items())) if access else ())
        if key not in self._storages:
            config = self.config.storage
            if access is not None:
                config = config.model_copy(update=access.model_dump(exclude_none=True))
            try:
                self._storages[key] = open_storage(location, config)
            except StorageError as exc:
                raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        return self._storages[key]

    def _renew(self, lease_s: float | None = None) -> None:
        if lease_s is not None:
            self._lease_s = lease_s
        self.lease_deadline = time.monotonic() + self._lease_s

    def _phase_response(self, detail: str = "") -> PhaseResponse:
        return PhaseResponse(
            checkpoint_id=self.checkpoint_id,
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

    async def _once(self, verb: Verb, checkpoint_id: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` once per (verb, id); repeats wait for and return the same answer."""
        key = (verb, checkpoint_id)
        task = self._ops.get(key)
        if task is None:
            task = asyncio.create_task(self._timed(verb, work), name=f"{verb}-{checkpoint_id}")
            self._ops[key] = task
            task.add_done_callback(lambda t: self._forget_failed(key, t))
        return await asyncio.shield(task)

    def _forget_failed(self, key: tuple[Verb, str], task: asyncio.Task) -> None:
        if (task.cancelled() or task.exception() is not None) and self._ops.get(key) is task:
            del self._ops[key]  # a failed verb may be retried

    async def _timed(self, verb: Verb, work: Callable[[], Awaitable[T]]) -> T:
        started = time.perf_counter()
        outcome = "error"
        try:
            result = await work()
            outcome = getattr(result, "status", "ok")
            return result
        finally:
            self.metrics.phase_seconds.labels(verb=verb, outcome=outcome).observe(time.perf_counter() - started)

    def _close(self, verb: Verb, event: str, phase: Phase) -> PhaseResponse:
        """End the open checkpoint: admission reopens, per-checkpoint answers are dropped."""
        checkpoint_id = self.checkpoint_id
        assert checkpoint_id is not None
        self.checkpoint_id = None
        self._set_phase(phase, event)
        self.lease_deadline = None
        self._restored = None
        response = PhaseResponse(
            checkpoint_id=checkpoint_id, participant_id=self.participant_id, role=self.role, phase=self.phase, detail=event
        )
        self._closed[checkpoint_id] = (verb, response)
        current = asyncio.current_task()
        for key in [k for k in self._ops if k[1] == checkpoint_id]:
            task = self._ops.pop(key)
            if not task.done() and task is not current:
                task.cancel()
        return response

    # --- verbs -----------------------------------------------------------------------

    def status(self) -> StatusResponse:
        remaining = None if self.lease_deadline is None else max(0.0, self.lease_deadline - time.monotonic())
        return StatusResponse(
            participant_id=self.participant_id,
            server=self.server,
            role=self.role,
            checkpoint_mode=self.participant.checkpoint_mode,
            checkpoint_verify=self.participant.checkpoint_verify,
            phase=self.phase,
            checkpoint_id=self.checkpoint_id,
            lease_remaining_s=remaining,
            admission_open=self.admission.is_open,
            inflight=len(self.admission.inflight),
            live=self.participant.live(),
            blockers=self.current_blockers(),
            last_event=self.last_event,
        )

    def current_blockers(self) -> list[Blocker]:
        return self.admission.blocking() + self.participant.blockers()

    async def prepare(self, req: PrepareRequest) -> PrepareResponse:
        cid = req.checkpoint_id
        if (Verb.PREPARE, cid) in self._ops:
            return await self._once(Verb.PREPARE, cid, self._never)
        if self.checkpoint_id is not None:
            raise ApiError(
                ErrorCode.CHECKPOINT_BUSY,
                f"checkpoint {self.checkpoint_id} is open on {self.participant_id} (phase {self.phase}); "
                f"cannot prepare {cid}",
                details={"open_checkpoint_id": self.checkpoint_id, "phase": self.phase},
            )
        self._closed.pop(cid, None)
        self.checkpoint_id = cid
        self._renew(req.lease_s)
        self._set_phase(Phase.PREPARING, f"prepare {cid}: admission closed")
        return await self._once(Verb.PREPARE, cid, lambda: self._run_prepare(req))

    async def _never(self) -> Any:  # pragma: no cover - only reached if an op vanished
        raise ApiError(ErrorCode.UNKNOWN_CHECKPOINT, "operation is gone")

    async def _run_prepare(self, req: PrepareRequest) -> PrepareResponse:
        cid = req.checkpoint_id
        started = time.monotonic()
        deadline = started + req.deadline_s
        await self.participant.prepare(cid)
        poll = self.config.checkpoint.poll_interval_s
        while True:
            if self.checkpoint_id != cid:
                raise ApiError(ErrorCode.UNKNOWN_CHECKPOINT, f"checkpoint {cid} was aborted while preparing")
            blockers = self.current_blockers()
            now = time.monotonic()
            if not blockers or now >= deadline:
                break
            await asyncio.sleep(min(poll, max(0.0, deadline - now)))
        status = Phase.BLOCKED if blockers else Phase.PREPARED
        self._set_phase(status, f"prepare {cid}: {status}" + (f" ({len(blockers)} blockers)" if blockers else ""))
        return PrepareResponse(
            checkpoint_id=cid,
            participant_id=self.participant_id,
            role=self.role,
            status=status,
            blockers=blockers,
            waited_s=round(time.monotonic() - started, 6),
        )

    async def commit(self, req: CommitRequest) -> CommitResponse:
        cid = req.checkpoint_id
        if (Verb.COMMIT, cid) not in self._ops:
            self._require_open_checkpoint(cid)
            if self.phase != Phase.PREPARED:
                raise ApiError(
                    ErrorCode.INVALID_PHASE, f"commit needs a prepared checkpoint; {self.participant_id} is {self.phase}"
                )
        return await self._once(Verb.COMMIT, cid, lambda: self._run_commit(req))

    async def _run_commit(self, req: CommitRequest) -> CommitResponse:
        started = time.perf_counter()
        self._renew()
        storage = self.storage(req.location, req.storage)
        scope = Scope.of(req.episodes)
        try:
            records = await self.participant.export(scope)
        except InvalidState as exc:
            raise ApiError(ErrorCode.INVALID_STATE, f"export for checkpoint {req.checkpoint_id} failed: {exc}") from None
        records = [
            r if r.attempt is not None or r.rollout_id is None
            else type(r)(r.key, r.data, r.rollout_id, self.fence.highest(r.rollout_id) or 0)
            for r in records
        ]
        try:
            key, data = await write_participant_checkpoint(
                storage,
                self._pool,
                checkpoint_id=req.checkpoint_id,
                participant_id=self.participant_id,
                server=self.server,
                role=self.role,
                mode=self.participant.checkpoint_mode,
                verify=self.participant.checkpoint_verify,
                records=records,
            )
        except StorageError as exc:
            raise ApiError(ErrorCode.STORAGE_UNAVAILABLE, f"writing checkpoint {req.checkpoint_id} failed: {exc}") from None
        await self.participant.release_out_of_scope(scope)
        total = sum(len(r.data) for r in records)
        self.metrics.records_written.inc(len(records))
        self.metrics.bytes_written.inc(total)
        self._renew()
        self._set_phase(Phase.COMMITTED, f"commit {req.checkpoint_id}: {len(records)} records, {total} bytes")
        return CommitResponse(
            checkpoint_id=req.checkpoint_id,
            participant_id=self.participant_id,
            role=self.role,
            manifest_key=key,
            manifest_sha256=sha256(data),
            manifest_size=len(data),
            records=len(records),
            bytes=total,
            episodes=sorted({r.rollout_id for r in records if r.rollout_id}),
            duration_s=round(time.perf_counter() - started, 6),
        )

    async def resume(self, req: CheckpointRef) -> PhaseResponse:
        return await self._finish(Verb.RESUME, req.checkpoint_id)

    async def abort(self, req: CheckpointRef) -> PhaseResponse:
        return await self._finish(Verb.ABORT, req.checkpoint_id)

    async def _finish(self, verb: Verb, cid: str) -> PhaseResponse:
        if self.checkpoint_id is None and cid in self._closed:
            return self._closed[cid][1]  # idempotent repeat
        self._require_open_checkpoint(cid)
        running = [t for (v, c), t in self._ops.items() if c == cid and v in (Verb.COMMIT, Verb.RESTORE) and not t.done()]
        if running:
            raise ApiError(ErrorCode.CHECKPOINT_BUSY, f"{verb} must wait: a {running[0].get_name()} is still running")
        return await self._once(verb, cid, lambda: self._run_finish(verb, cid))

    async def _run_finish(self, verb: Verb, cid: str) -> PhaseResponse:
        restored = self.phase in (Phase.RESTORED, Phase.RESTORING)
        abandon = verb is Verb.ABORT or self.phase in (Phase.PREPARING, Phase.BLOCKED)
        if abandon and restored and self._restored is not None:
            await self.participant.uninstall(self._restored)
        if abandon:
            await self.participant.abort()
        else:
            await self.participant.resume()
            if restored and self._decision is not None and self._restore_answer is not None:
                self._remember_resumed(cid, self._decision[1], self._restore_answer)
        undone = restored and abandon
        phase: Phase = self._phase_before_restore if undone else Phase.OPEN
        return self._close(verb, f"{verb} {cid}: admission open" + (" (restore undone)" if undone else ""), phase)

    async def restore(self, req: RestoreRequest) -> RestoreResponse:
        cid = req.checkpoint_id
        done = self._resumed_restores.get(cid)
        if done is not None and req.restore_id == done[0] and self.checkpoint_id is None:
            return done[1]  # a re-run coordinator repeats a restore this process already finished
        if (Verb.RESTORE, cid) not in self._ops:
            if self.checkpoint_id is not None:
                raise ApiError(
                    ErrorCode.CHECKPOINT_BUSY,
                    f"checkpoint {self.checkpoint_id} is open on {self.participant_id}; cannot restore",
                )
            if self.phase not in OPEN_PHASES:
                raise ApiError(ErrorCode.INVALID_PHASE, f"{self.participant_id} cannot restore in phase {self.phase}")
            self._closed.pop(cid, None)
            self._phase_before_restore = self.phase
            self._decision = None
            self._restore_answer = None
            self.checkpoint_id = cid
            self._renew(req.lease_s)
            self._set_phase(Phase.RESTORING, f"restore {cid}: admission closed")
        return await self._once(Verb.RESTORE, cid, lambda: self._run_restore(req))

    async def _run_restore(self, req: RestoreRequest) -> RestoreResponse:
        started = time.perf_counter()
        try:
            storage = self.storage(req.location, req.storage)
            self._decision = (storage, req.restore_id) if req.restore_id else None
            try:
                manifest, records = await read_participant_checkpoint(
                    storage, self._pool, req.manifest_key, req.manifest_sha256
                )
            except IncompleteCheckpoint as exc:
                raise ApiError(ErrorCode.UNKNOWN_CHECKPOINT, f"checkpoint {req.checkpoint_id} is incomplete: {exc}") from None
            except StorageError as exc:
                raise ApiError(ErrorCode.STORAGE_UNAVAILABLE, f"reading checkpoint {req.checkpoint_id} failed: {exc}") from None
            if manifest.checkpoint_id != req.checkpoint_id:
                raise InvalidState(f"manifest belongs to checkpoint {manifest.checkpoint_id}, not {req.checkpoint_id}")
            if manifest.participant_id != self.participant_id or manifest.role != self.role:
                raise InvalidState(
                    f"manifest is for {manifest.role} {manifest.participant_id}, this is {self.role} {self.participant_id}"
                )
            validated = await self.participant.validate(records)
        except InvalidState as exc:
            self._abandon_restore(f"restore {req.checkpoint_id} refused: {exc}")
            raise ApiError(ErrorCode.INVALID_STATE, str(exc)) from None
        except BaseException:
            self._abandon_restore(f"restore {req.checkpoint_id} failed")
            raise
        await self.participant.install(validated)
        self._restored = validated
        episodes: dict[str, int] = {}
        for record in records:
            if record.rollout_id is not None and record.new_attempt is not None:
                self.fence.advance(record.rollout_id, record.new_attempt)
                episodes[record.rollout_id] = max(episodes.get(record.rollout_id, 0), record.new_attempt)
        total = sum(len(r.data) for r in records)
        self.metrics.records_restored.inc(len(records))
        self.metrics.bytes_restored.inc(total)
        self._renew()
        self._set_phase(Phase.RESTORED, f"restore {req.checkpoint_id}: {len(records)} records installed")
        self._restore_answer = RestoreResponse(
            checkpoint_id=req.checkpoint_id,
            participant_id=self.participant_id,
            role=self.role,
            records=len(records),
            bytes=total,
            episodes=episodes,
            duration_s=round(time.perf_counter() - started, 6),
        )
        return self._restore_answer

    def _remember_resumed(self, cid: str, restore_id: str, answer: RestoreResponse) -> None:
        self._resumed_restores[cid] = (restore_id, answer)
        while len(self._resumed_restores) > 16:
            del self._resumed_restores[next(iter(self._resumed_restores))]

    def _abandon_restore(self, event: str) -> None:
        """A failed restore installed nothing: go back to where we were."""
        self.checkpoint_id = None
        self.lease_deadline = None
        self._set_phase(self._phase_before_restore, event)

    async def lease(self, req: CheckpointRef) -> PhaseResponse:
        self._require_open_checkpoint(req.checkpoint_id)
        self._renew()
        return self._phase_response("lease renewed")

    async def retire(self, req: RetireRequest) -> RetireResponse:
        if self.checkpoint_id is not None:
            raise ApiError(
                ErrorCode.CHECKPOINT_BUSY,
                f"retire is refused while checkpoint {self.checkpoint_id} is open on {self.participant_id}",
            )
        retired = await self.participant.retire(req.rollout_id, req.attempt)
        self.fence.advance(req.rollout_id, req.attempt + 1)
        log.info("retired", extra={"rollout_id": req.rollout_id, "attempt": req.attempt, "dropped": retired})
        return RetireResponse(
            rollout_id=req.rollout_id, attempt=req.attempt, participant_id=self.participant_id, retired=retired
        )

    # --- lease -----------------------------------------------------------------------

    async def _watch_lease(self) -> None:
        interval = self.config.checkpoint.lease_check_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                await self._expire_if_due()
            except Exception:  # noqa: BLE001 - the watcher must survive to guard the next checkpoint
                log.exception("lease expiry handling failed")

    async def _expire_if_due(self) -> None:
        if self.checkpoint_id is None or self.lease_deadline is None:
            return
        if time.monotonic() < self.lease_deadline:
            return
        cid = self.checkpoint_id
        busy = any(c == cid and v in (Verb.COMMIT, Verb.RESTORE) and not t.done() for (v, c), t in self._ops.items())
        if busy:
            return  # bounded work in progress; expire once it ends
        if self.phase == Phase.RESTORED and self._decision is not None:
            await self._expire_restore(cid, *self._decision)
            return
        log.warning("lease expired: aborting checkpoint by itself", extra={"checkpoint_id": cid, "phase": self.phase})
        self.metrics.lease_expiries.inc()
        prepare = self._ops.get((Verb.PREPARE, cid))
        if prepare is not None and not prepare.done():
            prepare.cancel()
        await self._run_finish(Verb.ABORT, cid)
        self.last_event = f"lease expired: checkpoint {cid} aborted, admission open"

    async def _expire_restore(self, cid: str, storage: Storage, restore_id: str) -> None:
        """The coordinator went quiet after this restore: follow the restore's decision object.

        Proposing ``abort`` either decides it (the coordinator had not decided yet, and will
        now abort everyone) or reads the ``resume`` the coordinator wrote before it died. If
        storage cannot be reached the restore stays closed and is retried each tick, for one more
        lease at most; then it is undone, and that is logged as an error.
        """
        assert self.lease_deadline is not None
        try:
            decision = await asyncio.to_thread(settle, storage, cid, restore_id, Decision.ABORT, self.participant_id)
        except (StorageError, InvalidState) as exc:
            if time.monotonic() < self.lease_deadline + self._lease_s:
                log.warning("lease expired; the restore decision cannot be read yet", extra={"checkpoint_id": cid, "error": str(exc)})
                return
            log.error("the restore decision stayed unreadable: undoing the restore", extra={"checkpoint_id": cid, "error": str(exc)})
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
        self.last_event = f"lease expired: restore {restore_id} of checkpoint {cid} {verb} as decided, admission open"
