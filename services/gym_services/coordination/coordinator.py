"""The coordinator: the checkpoint and restore transactions over one stack's participants (``docs/protocol.md``).

Free of kopf and Kubernetes: the CLI (:mod:`gym_services.commands.stack`) and the demo drive it for a
local stack, the operator (``gym_operator.handlers``) for pods. It is a thin face over three objects:

- :class:`~gym_services.coordination.participants.ParticipantSet`: who the participants are and how they
  are called (fan-out, the by-role order, pause leases, resume and abort);
- :class:`~gym_services.coordination.checkpoint.CheckpointTransaction`: claim, prepare, capture, persist,
  publish;
- :class:`~gym_services.coordination.restore.RestoreTransaction`: restore, decide, resume.

Each call of :meth:`Coordinator.checkpoint` or :meth:`Coordinator.restore` builds one transaction object and
runs it through :meth:`Coordinator.run`, the one place every transaction of this coordinator passes (where
"one transaction at a time per stack" belongs). The result of each is built in one place,
:mod:`~gym_services.coordination.results`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable

from gym_services.base.config import StorageConfig
from gym_services.control.models import GlobalManifest, StatusResponse
from gym_services.control.protocol import (
    DEFAULT_LEASE_S,
    DEFAULT_PREPARE_TIMEOUT_S,
    CheckpointMethod,
)
from gym_services.control.storage import Storage, open_storage
from gym_services.control.storage.gateway import GrantIssuer
from gym_services.control.store import CheckpointStore
from gym_services.coordination.checkpoint import CheckpointTransaction
from gym_services.coordination.client import ControlClient, ParticipantError, ParticipantRef
from gym_services.coordination.deadlines import DEADLINES, Deadlines
from gym_services.coordination.participants import ParticipantSet, by_role, check_replica_sets
from gym_services.coordination.restore import RestoreTransaction
from gym_services.coordination.results import EventSink, Progress
from gym_services.coordination.transaction import (
    BlockerInfo,
    Cancellation,
    ParticipantSummary,
    TransactionCancelled,
    TransactionError,
    TransactionKind,
    TransactionPhase,
    TransactionResult,
)

__all__ = [
    "BlockerInfo",
    "Coordinator",
    "ParticipantSummary",
    "TransactionCancelled",
    "TransactionError",
    "TransactionPhase",
    "TransactionResult",
    "by_role",
    "check_replica_sets",
    "list_checkpoints",
]


class Coordinator:
    """Checkpoints and restores of one stack's participants; status and retire outside any transaction.

    Subclasses may swap a transaction class (:attr:`checkpoint_transaction`, :attr:`restore_transaction`)
    or how a location is opened (:meth:`_storage`)."""

    checkpoint_transaction: type[CheckpointTransaction] = CheckpointTransaction
    restore_transaction: type[RestoreTransaction] = RestoreTransaction

    def __init__(
        self,
        participants: Iterable[ParticipantRef],
        client: ControlClient,
        *,
        storage_config: StorageConfig | None = None,
        grants: GrantIssuer | None = None,
        on_event: EventSink | None = None,
        deadlines: Deadlines = DEADLINES,
    ) -> None:
        """``storage_config`` is how the coordinator reaches storage; ``grants``, when given, issues each
        participant's storage grant, sent with its capture and restore: the servers then reach the location only
        through the storage gateway, never with keys of their own (the operator's way; without it each server uses
        its own storage config). ``on_event`` is told of every phase a transaction enters (it may be replaced
        between transactions)."""
        self.participant_set = ParticipantSet(participants, client, deadlines)
        self.storage_config = storage_config or StorageConfig()
        self.grants = grants
        self.on_event = on_event

    @property
    def participants(self) -> list[ParticipantRef]:
        return self.participant_set.refs

    @property
    def client(self) -> ControlClient:
        return self.participant_set.client

    def _storage(self, location: str) -> Storage:
        return open_storage(location, self.storage_config)

    def _store(self, location: str) -> CheckpointStore:
        return CheckpointStore(self._storage(location))

    async def run(self, transaction: CheckpointTransaction | RestoreTransaction) -> TransactionResult:
        """Run one transaction of this coordinator to its result."""
        return await transaction.run()

    async def checkpoint(
        self,
        checkpoint_id: str,
        location: str,
        *,
        prepare_timeout_s: float = DEFAULT_PREPARE_TIMEOUT_S,
        lease_s: float = DEFAULT_LEASE_S,
        transaction_id: str | None = None,
        claimed_by: str = "coordinator",
        method: CheckpointMethod = CheckpointMethod.BACKGROUND,
        cancel: asyncio.Event | None = None,
        final: bool = False,
    ) -> TransactionResult:
        """Take checkpoint ``checkpoint_id`` at ``location`` (:class:`CheckpointTransaction`); all or nothing.

        ``transaction_id`` names this transaction (the Checkpoint resource's uid on Kubernetes; a
        fresh one otherwise). A checkpoint id names one transaction: the same transaction run again
        carries on (or is answered from its manifest once published); another transaction under an
        existing id is refused before anything is paused (:meth:`CheckpointStore.claim`).

        ``cancel``, when set before the checkpoint is published, ends it as failed (:class:`TransactionCancelled`):
        a prepare still waiting for boundaries is interrupted, a capture is let finish first (a
        participant refuses abort while it captures); once published, it completes.

        ``final``: the checkpoint a termination takes (``docs/protocol.md``, "Termination"): persisted and published
        under the pause (as ``sync``), and never resumed; every participant holds it until its process exits.
        """
        progress = Progress(
            TransactionKind.CHECKPOINT,
            checkpoint_id,
            location,
            sink=self.on_event,
            transaction_id=transaction_id or uuid.uuid4().hex,
        )
        transaction = self.checkpoint_transaction(
            self.participant_set,
            self._store(location),
            progress,
            prepare_timeout_s=prepare_timeout_s,
            lease_s=lease_s,
            method=method,
            claimed_by=claimed_by,
            cancellation=Cancellation(cancel),
            grants=self.grants,
            final=final,
        )
        return await self.run(transaction)

    async def restore(
        self,
        checkpoint_id: str,
        location: str,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        restore_id: str | None = None,
        cancel: asyncio.Event | None = None,
        decisions: CheckpointStore | None = None,
    ) -> TransactionResult:
        """Restore checkpoint ``checkpoint_id`` from ``location`` into every participant (:class:`RestoreTransaction`).

        ``restore_id`` names the transaction (the Restore resource's uid on Kubernetes, so an
        operator restarted mid-restore repeats the same one; a fresh id otherwise). ``cancel``, when
        set before the decision is written, ends it as failed and undoes it everywhere
        (:class:`TransactionCancelled`); once decided, it completes. ``decisions`` is the store of the restore's
        decision object when ``location`` is read-only (another location; ``grants`` then send the participants'
        decision requests there too); ``location`` itself otherwise.
        """
        progress = Progress(
            TransactionKind.RESTORE,
            checkpoint_id,
            location,
            sink=self.on_event,
            restore_id=restore_id or uuid.uuid4().hex,
        )
        transaction = self.restore_transaction(
            self.participant_set,
            self._store(location),
            progress,
            lease_s=lease_s,
            cancellation=Cancellation(cancel),
            grants=self.grants,
            decisions=decisions,
        )
        return await self.run(transaction)

    async def abort_all(self, checkpoint_id: str, refs: list[ParticipantRef]) -> list[str]:
        """Abort ``refs``, the servers agents call first (a Checkpoint deleted while no transaction of this process ran
        it)."""
        return await self.participant_set.abort(checkpoint_id, refs)

    async def retire(self, rollout_id: str, attempt: int) -> dict[str, bool]:
        """Drop one attempt: environment, then agent, then model and resources together."""
        return await self.participant_set.retire(rollout_id, attempt)

    async def status(self) -> dict[str, StatusResponse | ParticipantError]:
        """Every participant's status, or why it could not be read."""
        return await self.participant_set.status()


def list_checkpoints(
    location: str, storage_config: StorageConfig | None = None
) -> list[tuple[str, GlobalManifest | None]]:
    """Checkpoint ids at a location with their manifest (None when incomplete)."""
    return CheckpointStore(open_storage(location, storage_config)).checkpoints()
