"""The restore transaction (``docs/protocol.md``, "Transactions"): one object per restore run.

:meth:`RestoreTransaction.run` reads as its named steps:

:meth:`~RestoreTransaction.read_checkpoint` -> the participant set's
:meth:`~gym_services.coordination.participants.ParticipantSet.match` -> :meth:`~RestoreTransaction.restore_all`
-> :meth:`~RestoreTransaction.decide` (``resume`` written as the restore's decision before anyone resumes) ->
resume (the servers agents call first, the controller last).

Any failed step before the decision aborts every participant, so no restore stays half installed; the
decision is the point of no return. A participant whose lease runs out follows the decision object, so a
coordinator dying between two resumes still leaves the restore installed everywhere, and one dying before
the decision leaves it installed nowhere.
"""

from __future__ import annotations

import asyncio

from gym_services.control.models import (
    GlobalManifest,
    ManifestParticipant,
    RestoreRequest,
    RestoreResponse,
)
from gym_services.control.participant import InvalidState
from gym_services.control.protocol import Decision, Verb
from gym_services.control.storage import StorageError
from gym_services.control.storage.gateway import GrantIssuer
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ParticipantRef
from gym_services.coordination.participants import ParticipantSet
from gym_services.coordination.results import Outcome, Progress
from gym_services.coordination.transaction import (
    Cancellation,
    TransactionError,
    TransactionPhase,
    TransactionResult,
)


class RestoreTransaction:
    """One restore of a published checkpoint into a participant set: restore, decide, resume; all or nothing.

    ``progress`` names it (checkpoint id, location, restore id: the Restore resource's uid on Kubernetes,
    so an operator restarted mid-restore repeats the same one). ``grants``, when given, issue each participant's
    storage grant, sent with its restore call (the servers then read through the storage gateway). ``decisions`` is
    the store of the restore's decision object when it is not ``store`` (a read-only location)."""

    def __init__(
        self,
        participants: ParticipantSet,
        store: CheckpointStore,
        progress: Progress,
        *,
        lease_s: float,
        cancellation: Cancellation | None = None,
        grants: GrantIssuer | None = None,
        decisions: CheckpointStore | None = None,
    ) -> None:
        if progress.restore_id is None:
            raise ValueError("a restore transaction needs its restore id")
        self.participants = participants
        self.store = store
        self.progress = progress
        self.checkpoint_id = progress.checkpoint_id
        self.restore_id: str = progress.restore_id
        self.lease_s = lease_s
        self.cancellation = cancellation or Cancellation()
        self.grants = grants
        self.decisions = decisions or store

    async def run(self) -> TransactionResult:
        """Restore every participant, decide, resume. Cancelled before the decision is written, it ends as
        failed and is undone everywhere; once decided, it completes."""
        try:
            manifest = await self.read_checkpoint()
            refs = self.participants.match(self.checkpoint_id, manifest)
        except (TransactionError, StorageError, InvalidState) as exc:
            return self.progress.failed(str(exc))
        entries = {p.participant_id: p for p in manifest.participants}
        clock = self.progress.clock
        async with self.participants.leases(self.checkpoint_id, self.lease_s) as touched:
            touched.extend(refs)
            try:
                self.cancellation.check()
                # a participant still restoring is aborted, not waited for
                restored = await self.cancellation.guard(self.restore_all(refs, entries))
                self.cancellation.check()
                await self.decide()
            except TransactionError as exc:
                await self.progress.report(TransactionPhase.ABORTING, error=str(exc))
                warnings = await self.participants.abort(self.checkpoint_id, refs)
                await self.progress.report(TransactionPhase.FAILED, error=str(exc))
                return self.progress.failed(str(exc), warnings=warnings)
            await self.progress.enter(TransactionPhase.RESUMING)
            with clock.step("resume"):
                warnings = await self.participants.resume(self.checkpoint_id, refs)
        clock.timings["total"] = clock.elapsed()
        result = self.progress.completed(Outcome.restored(self.checkpoint_id, refs, entries, restored), warnings)
        await self.progress.enter(TransactionPhase.COMPLETED, records=result.records)
        return result

    async def read_checkpoint(self) -> GlobalManifest:
        """The published manifest, refusing a restore that was abandoned earlier or a checkpoint never published."""
        checkpoint_id, restore_id = self.checkpoint_id, self.restore_id
        try:
            manifest = await asyncio.to_thread(self.store.published, checkpoint_id)
            earlier = await asyncio.to_thread(self.decisions.decision, checkpoint_id, restore_id)
        except (StorageError, InvalidState) as exc:
            raise TransactionError(f"cannot read checkpoint {checkpoint_id}: {exc}") from None
        if earlier == Decision.ABORT:
            raise TransactionError(
                f"restore {restore_id} of checkpoint {checkpoint_id} was abandoned earlier "
                "(a participant's lease ran out before it was decided) and undone everywhere; start a new restore"
            )
        if manifest is None:
            raise TransactionError(
                f"checkpoint {checkpoint_id} has no manifest at "
                f"{self.store.url}/{self.store.manifest_key(checkpoint_id)}: "
                "it is unknown or incomplete and is never restored"
            )
        return manifest

    async def restore_all(
        self, refs: list[ParticipantRef], entries: dict[str, ManifestParticipant]
    ) -> dict[str, RestoreResponse]:
        """Every participant reads, verifies and installs its records (each one validates all before installing any)."""
        await self.progress.enter(TransactionPhase.RESTORING, participants=len(refs))

        def request(ref: ParticipantRef) -> RestoreRequest:
            entry = entries[ref.participant_id]
            return RestoreRequest(
                checkpoint_id=self.checkpoint_id,
                location=self.progress.location,
                manifest_key=entry.manifest_key,
                manifest_sha256=entry.manifest_sha256,
                lease_s=self.lease_s,
                restore_id=self.restore_id,
                storage=self.grants.restore(self.checkpoint_id, ref.participant_id, self.restore_id)
                if self.grants
                else None,
            )

        client = self.participants.client
        timeout = self.participants.deadlines.restore_call(self.lease_s)
        with self.progress.clock.step("restore"):
            return await self.participants.all(
                refs, Verb.RESTORE, lambda r: client.restore(r, request(r), timeout_s=timeout)
            )

    async def decide(self) -> None:
        """Write ``resume`` as the restore's decision; fails when it does not hold (a lease ran out first)."""
        checkpoint_id, restore_id = self.checkpoint_id, self.restore_id
        decision: Decision | None
        try:
            decision = await asyncio.to_thread(
                self.decisions.settle, checkpoint_id, restore_id, Decision.RESUME, "coordinator"
            )
        except (StorageError, InvalidState) as exc:
            try:  # the put may have landed before the error: the object says what holds
                decision = await asyncio.to_thread(self.decisions.decision, checkpoint_id, restore_id)
            except (StorageError, InvalidState):
                decision = None
            if decision is None:
                raise TransactionError(f"cannot write the decision of restore {restore_id}: {exc}") from None
        if decision == Decision.ABORT:
            raise TransactionError(
                f"a participant's lease ran out before restore {restore_id} was decided; it is undone everywhere"
            )
