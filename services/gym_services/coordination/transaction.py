"""The vocabulary of a checkpoint or restore transaction: its phases, its result, how it fails or is stopped.

:class:`TransactionPhase` is what a transaction (:mod:`~gym_services.coordination.checkpoint`,
:mod:`~gym_services.coordination.restore`) reports as it goes and what the operator writes into a
Checkpoint's or Restore's ``status.phase``: every member is in both CRDs' ``status.phase`` enum (a
test checks it). :class:`TransactionResult` is what the CLI prints and the operator turns into a
status; :mod:`~gym_services.coordination.results` is the one place it is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Iterable
from typing import TypeVar

from pydantic import BaseModel, Field

from gym_services.control.models import Blocker, CheckpointMethod, Replica, Role, ScopeReport


class TransactionPhase(enum.StrEnum):
    """Where a transaction is; ``Completed`` and ``Failed`` are final (``docs/protocol.md``, "Transactions")."""

    PENDING = "Pending"  # not started: waiting for the stack (another transaction holds it)
    PREPARING = "Preparing"
    CAPTURING = "Capturing"  # every participant captures its state (the stack is paused)
    PERSISTING = "Persisting"  # every upload written and verified (resumed already, or still paused with ``sync``)
    PUBLISHING = "Publishing"
    RESTORING = "Restoring"
    ABORTING = "Aborting"  # a step failed: every touched participant is being aborted (the stack is still paused)
    RESUMING = "Resuming"
    COMPLETED = "Completed"
    FAILED = "Failed"

    @property
    def final(self) -> bool:
        return self in (TransactionPhase.COMPLETED, TransactionPhase.FAILED)


class TransactionKind(enum.StrEnum):
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"


class TransactionStatus(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"


class BlockerInfo(Blocker):
    """A blocker and the participant that reported it."""

    participant: str


class ParticipantSummary(BaseModel):
    participant_id: str
    role: Role
    records: int = 0
    bytes: int = 0
    manifest_key: str | None = None
    episodes: int = Field(default=0, description="live episodes this participant held (checkpoint) or restored")
    replica: Replica | None = Field(default=None, description="which replica of which server (absent: not replicated)")
    scope: ScopeReport = Field(default_factory=ScopeReport, description="sessions the scope did not keep by rollout")


class TransactionResult(BaseModel):
    """What the CLI prints and the operator writes into a resource's status."""

    kind: TransactionKind
    checkpoint_id: str
    location: str
    status: TransactionStatus
    phase: TransactionPhase = Field(description="the last phase reached")
    participants: list[ParticipantSummary] = Field(default_factory=list)
    blockers: list[BlockerInfo] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
    pause_s: float = 0.0
    published_s: float | None = Field(default=None, description="seconds from the start until the manifest was written")
    method: CheckpointMethod | None = Field(default=None, description="how a checkpoint's records were written")
    final: bool = Field(default=False, description="a final checkpoint: nobody was resumed (docs/protocol.md)")
    records: int = 0
    bytes: int = 0
    objects: int = Field(default=0, description="objects a checkpoint wrote, manifests included")
    written_bytes: int = Field(default=0, description="bytes a checkpoint wrote, manifests included")
    reused: int = Field(default=0, description="records referenced in earlier checkpoints instead of written")
    episodes: dict[str, int] = Field(default_factory=dict, description="rollout -> attempt (restore) or 0")
    manifest_key: str | None = None
    restore_id: str | None = Field(default=None, description="the restore transaction's name (restores only)")
    transaction_id: str | None = Field(
        default=None, description="the checkpoint transaction the id names (checkpoints only; repeat it with this id)"
    )
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)

    @property
    def completed(self) -> bool:
        return self.status is TransactionStatus.COMPLETED


T = TypeVar("T")


class TransactionError(Exception):
    """A step could not complete; the participants touched so far are aborted."""

    def __init__(self, message: str, blockers: Iterable[BlockerInfo] = ()) -> None:
        super().__init__(message)
        self.blockers = list(blockers)


class TransactionCancelled(TransactionError):
    """The transaction was cancelled from outside (on Kubernetes: its resource was deleted).

    A checkpoint is cancellable until it publishes, a restore until its decision is written; the
    participants touched so far are aborted at once, so none waits for its lease.
    """

    def __init__(self) -> None:
        super().__init__("cancelled before it completed; every participant touched was aborted")


class Cancellation:
    """When a transaction stops waiting: checked between steps and raced against the steps that wait.

    Today the one reason is an event set from outside (a deleted resource, Ctrl-C). A stop for another
    reason (a hard deadline) is one more condition in :meth:`check` and one more waiter in :meth:`guard`;
    the transactions already consult this object at each point where stopping is safe.
    """

    def __init__(self, event: asyncio.Event | None = None) -> None:
        self.event = event

    def check(self) -> None:
        """Raise :class:`TransactionCancelled` if the transaction was cancelled."""
        if self.event is not None and self.event.is_set():
            raise TransactionCancelled()

    async def guard(self, work: Awaitable[T]) -> T:
        """Run ``work``; if the transaction is cancelled first, stop it and raise :class:`TransactionCancelled`."""
        if self.event is None:
            return await work
        task = asyncio.ensure_future(work)
        waiter = asyncio.ensure_future(self.event.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the caller itself was cancelled: the work goes with it
            task.cancel()
            raise
        finally:
            waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise TransactionCancelled()
        return task.result()
