"""``restore`` on one server's control plane, and how a restore is settled when its coordinator went quiet.

``restore`` reads this participant's records, each verified against its manifest (which must be its own),
lets the participant validate all of them and install them, and moves every restored episode's fence to attempt
+ 1 (:mod:`.fencing`); admission stays closed until ``resume`` (:mod:`.closing`). A restore that fails installed
nothing and goes back to where the process was. When the lease runs out after a restore that names its decision
object, :meth:`Restoring.settle` follows the decision (``docs/protocol.md``, "Restore decisions").
"""

from __future__ import annotations

import asyncio
import time
from typing import Generic

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.control.admission import Admission
from gym_services.control.closing import Closing
from gym_services.control.gc_pause import collection_paused
from gym_services.control.metrics import ControlMetrics
from gym_services.control.models import RestoreRequest, RestoreResponse
from gym_services.control.open_checkpoint import OpenCheckpoint, RestoreInProgress
from gym_services.control.participant import F, InvalidState, Participant, RestoredRecord, V
from gym_services.control.persists import Persists
from gym_services.control.protocol import OPEN_PHASES, Decision, Phase, Verb
from gym_services.control.records import IncompleteCheckpoint, ReadBack, read_participant_records
from gym_services.control.storage import StorageError
from gym_services.control.storage_clients import StorageClients
from gym_services.control.store import CheckpointStore

log = get_logger("control")


class Restoring(Generic[V, F]):
    def __init__(
        self,
        participant: Participant[V, F],
        admission: Admission,
        opened: OpenCheckpoint[V, F],
        storages: StorageClients,
        persists: Persists[F],
        metrics: ControlMetrics,
        closing: Closing[V, F],
    ) -> None:
        self.participant = participant
        self.admission = admission
        self.opened = opened
        self.storages = storages
        self.persists = persists
        self.metrics = metrics
        self.closing = closing

    async def restore(self, req: RestoreRequest) -> RestoreResponse:
        cid = req.checkpoint_id
        opened = self.opened
        done = opened.calls.resumed_restore(cid, req.restore_id)
        if done is not None and opened.id is None:
            return done  # a re-run coordinator repeats a restore this process already finished
        if not opened.calls.started(Verb.RESTORE, cid):
            opened.refuse_busy(Verb.RESTORE, cid)
            if opened.phase not in OPEN_PHASES:
                raise ApiError(
                    ErrorCode.INVALID_PHASE, f"{opened.participant_id} cannot restore in phase {opened.phase}"
                )
            opened.restoring = RestoreInProgress(before=opened.phase)
            opened.open(cid, req.lease_s, Phase.RESTORING, f"restore {cid}: admission closed")
        return await opened.once(Verb.RESTORE, cid, lambda: self._run(req))

    async def _run(self, req: RestoreRequest) -> RestoreResponse:
        started = time.perf_counter()
        opened = self.opened
        restore = opened.restoring
        assert restore is not None
        try:
            store = CheckpointStore(await asyncio.to_thread(self.storages.get, req.location, req.storage))
            restore.decision = (store, req.restore_id) if req.restore_id else None
            with collection_paused():  # a restore allocates per record as a capture does per session
                read = await self._read_records(store, req)
                records = read.records
                validated = await self.participant.validate(records)
        except InvalidState as exc:
            opened.undo_restore(f"restore {req.checkpoint_id} refused: {exc}")
            raise ApiError(ErrorCode.INVALID_STATE, str(exc)) from None
        except BaseException:
            opened.undo_restore(f"restore {req.checkpoint_id} failed")
            raise
        await self.participant.install(validated)
        restore.validated = validated
        self.persists.remember(store, read.reuse)  # the next checkpoint may reference these records
        episodes = self._advance_fence(records)
        total = sum(len(r.data) for r in records)
        self.metrics.records_restored.inc(len(records))
        self.metrics.bytes_restored.inc(total)
        opened.lease.renew()
        opened.move(Phase.RESTORED, f"restore {req.checkpoint_id}: {len(records)} records installed")
        restore.answer = RestoreResponse(
            checkpoint_id=req.checkpoint_id,
            participant_id=opened.participant_id,
            role=opened.role,
            records=len(records),
            bytes=total,
            episodes=episodes,
            duration_s=round(time.perf_counter() - started, 6),
        )
        return restore.answer

    async def _read_records(self, store: CheckpointStore, req: RestoreRequest) -> ReadBack:
        """This participant's records, each verified against its manifest, which must be its own."""
        opened = self.opened
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
        if manifest.participant_id != opened.participant_id or manifest.role != opened.role:
            raise InvalidState(
                f"manifest is for {manifest.role} {manifest.participant_id}, "
                f"this is {opened.role} {opened.participant_id}"
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

    async def settle(self, cid: str, store: CheckpointStore, restore_id: str) -> None:
        """The coordinator went quiet after this restore: follow the restore's decision object.

        Proposing ``abort`` either decides it (the coordinator had not decided yet, and will
        now abort everyone) or reads the ``resume`` the coordinator wrote before it died. If
        storage cannot be reached the restore stays closed and is retried each tick, for one more
        lease at most; then it is undone, and that is logged as an error.
        """
        opened = self.opened
        try:
            decision = await asyncio.to_thread(store.settle, cid, restore_id, Decision.ABORT, opened.participant_id)
        except (StorageError, InvalidState) as exc:
            if not opened.lease.overdue_by_a_lease():
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
        if opened.id != cid or opened.phase != Phase.RESTORED:
            return  # the coordinator closed it meanwhile
        log.warning(
            f"lease expired after restore {restore_id}: following its decision ({decision})",
            extra={"checkpoint_id": cid, "restore_id": restore_id},
        )
        self.metrics.restore_decisions.labels(decision=decision).inc()
        finish = Verb(decision)
        await opened.once(finish, cid, lambda: self.closing.run(finish, cid))
        verb = "resumed" if decision == Decision.RESUME else "undone"
        opened.phases.last_event = (
            f"lease expired: restore {restore_id} of checkpoint {cid} {verb} as decided, admission open"
        )
