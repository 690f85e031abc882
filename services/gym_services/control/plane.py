"""The checkpoint control plane of one server: the control verbs, over a few collaborators.

Built by the app factory (:func:`gym_services.server.app.create_server_app`) for every server and
called by its control routes (:mod:`gym_services.control.routes`). It builds its collaborators and hands each
verb to one of them:

- :mod:`.open_checkpoint`: the checkpoint (or restore) open now, its phase (:mod:`.phases`), its pause lease
  (:mod:`.lease`) and its calls, each run once per checkpoint id (:mod:`.repeats`);
- :mod:`.checkpointing`: ``prepare``, ``capture``, ``persist`` (background uploads: :mod:`.persists`);
- :mod:`.closing`: ``resume`` and ``abort``;
- :mod:`.restoring`: ``restore``, and following a restore's decision object when the lease runs out;
- :mod:`.final`: a final checkpoint, held and never resumed, and the server's termination (:mod:`.termination`);
- admission and the attempt fence (:mod:`.admission`), storage clients (:mod:`.storage_clients`).

It answers ``status``, ``lease`` and ``retire`` itself, and runs the lease's expiry check. What depends on the
server's own state is its :class:`~gym_services.control.participant.Participant`'s business.

Phases: ``open -> preparing -> prepared|blocked -> captured -> open`` (resume) or
``-> open`` (abort), ``captured -> final`` (a final checkpoint, written); a fresh process:
``fresh -> restoring -> restored -> open``
(``docs/protocol.md``). Every verb is idempotent for the same checkpoint id: a repeat returns the first answer (or
waits for the first call still running).
"""

from __future__ import annotations

import asyncio
from typing import Generic

from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.control.admission import Admission
from gym_services.control.checkpointing import Checkpointing
from gym_services.control.closing import Closing
from gym_services.control.final import FinalHold
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
from gym_services.control.open_checkpoint import OpenCheckpoint
from gym_services.control.packs import PackWriter
from gym_services.control.participant import F, Participant, V, check_participant
from gym_services.control.persists import Persists
from gym_services.control.phases import PhaseMachine
from gym_services.control.protocol import Phase, Verb
from gym_services.control.restoring import Restoring
from gym_services.control.storage_clients import StorageClients
from gym_services.control.termination import Termination

log = get_logger("control")


class ControlPlane(Generic[V, F]):
    def __init__(
        self,
        config: ServerConfig,
        participant: Participant[V, F],
        metrics: ControlMetrics,
        admission: Admission,
    ) -> None:
        check_participant(participant)
        self.config = config
        self.server = config.name
        self.participant_id = config.participant_id
        self.participant = participant
        self.role = participant.role
        self.metrics = metrics
        self.admission = admission
        self.phases = PhaseMachine(admission, metrics.admission_open)
        self.opened: OpenCheckpoint[V, F] = OpenCheckpoint(self.participant_id, self.role, self.phases, metrics)
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
        self.termination = Termination(
            config.checkpoint.termination_grace_s, metrics.terminating, holds_state=config.checkpoint.enabled
        )
        self.final = FinalHold(self.opened, self.persists, self.termination, metrics)
        self.checkpointing = Checkpointing(
            config, participant, admission, self.opened, self.storages, self.persists, self.final
        )
        self.closing = Closing(participant, self.opened, self.persists, self.final)
        self.restoring = Restoring(
            participant, admission, self.opened, self.storages, self.persists, metrics, self.closing
        )

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self.storages.warm)  # boto3 client made now, never under a checkpoint's pause
        interval = self.config.checkpoint.lease_check_interval_s
        self.opened.lease.watch(self._expire_if_due, interval, f"lease-{self.server}")

    async def stop(self) -> None:
        await self.opened.lease.stop()
        if self.opened.captured is not None:
            self.opened.captured.release()  # (a persist started releases it too: release is idempotent)
        self.opened.calls.cancel_all()
        self.persists.cancel_all()
        self.storages.shutdown()

    # --- what the rest of the server reads -------------------------------------------

    @property
    def phase(self) -> Phase:
        return self.phases.phase

    @property
    def checkpoint_id(self) -> str | None:
        """The checkpoint (or restore) open now."""
        return self.opened.id

    def current_blockers(self) -> list[Blocker]:
        return self.checkpointing.blockers()

    # --- the verbs ---------------------------------------------------------------------

    def status(self) -> StatusResponse:
        return StatusResponse(
            participant_id=self.participant_id,
            server=self.server,
            role=self.role,
            checkpoint_mode=self.participant.checkpoint_mode,
            checkpoint_verify=self.participant.checkpoint_verify,
            phase=self.phase,
            checkpoint_id=self.opened.id,
            lease_remaining_s=self.opened.lease.remaining(),
            admission_open=self.admission.is_open,
            inflight=len(self.admission.inflight),
            live=self.participant.live(),
            blockers=self.current_blockers(),
            last_event=self.phases.last_event,
            persist=job.status() if (job := self.persists.newest()) is not None else None,
            terminating=self.termination.status(),
        )

    async def prepare(self, req: PrepareRequest) -> PrepareResponse:
        return await self.checkpointing.prepare(req)

    async def capture(self, req: CaptureRequest) -> CaptureResponse:
        return await self.checkpointing.capture(req)

    async def persist(self, req: CheckpointRef) -> PersistResponse:
        return await self.checkpointing.persist(req)

    async def resume(self, req: CheckpointRef) -> PhaseResponse:
        return await self.closing.finish(Verb.RESUME, req.checkpoint_id)

    async def abort(self, req: CheckpointRef) -> PhaseResponse:
        return await self.closing.finish(Verb.ABORT, req.checkpoint_id)

    async def restore(self, req: RestoreRequest) -> RestoreResponse:
        return await self.restoring.restore(req)

    async def lease(self, req: CheckpointRef) -> PhaseResponse:
        self.opened.require(req.checkpoint_id)
        self.opened.lease.renew()
        return self.opened.response("lease renewed")

    async def retire(self, req: RetireRequest) -> RetireResponse:
        if self.opened.id is not None:
            raise ApiError(
                ErrorCode.CHECKPOINT_BUSY,
                f"retire is refused while checkpoint {self.opened.id} is open on {self.participant_id}",
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
        opened = self.opened
        cid = opened.id
        if cid is None or not opened.lease.expired():
            return
        if opened.calls.busy(cid, (Verb.CAPTURE, Verb.RESTORE)):
            return  # bounded work in progress; expire once it ends
        if self.phase is Phase.FINAL:
            self.final.expired(cid)  # never reopened: the process ends, a restore continues from the checkpoint
            return
        restore = opened.restoring
        if self.phase == Phase.RESTORED and restore is not None and restore.decision is not None:
            await self.restoring.settle(cid, *restore.decision)
            return
        log.warning("lease expired: aborting checkpoint by itself", extra={"checkpoint_id": cid, "phase": self.phase})
        self.metrics.lease_expiries.inc()
        prepare = opened.calls.task(Verb.PREPARE, cid)
        if prepare is not None and not prepare.done():
            prepare.cancel()
        await self.closing.run(Verb.ABORT, cid)
        self.phases.last_event = f"lease expired: checkpoint {cid} aborted, admission open"
