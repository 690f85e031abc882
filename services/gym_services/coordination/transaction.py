"""The vocabulary and result of a checkpoint or restore transaction.

:class:`TransactionPhase` is what the coordinator (:mod:`gym_services.coordination.coordinator`)
reports as it goes and what the operator writes into a Checkpoint's or Restore's
``status.phase``: every member is in both CRDs' ``status.phase`` enum (a test checks it).
:class:`TransactionResult` is what the CLI prints and the operator turns into a status.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, Field

from gym_services.control.models import Blocker, CheckpointMethod, Replica, Role


class TransactionPhase(enum.StrEnum):
    """Where a transaction is; ``Completed`` and ``Failed`` are final (``docs/protocol.md``, "Transactions")."""

    PENDING = "Pending"  # not started: waiting for the stack (another transaction holds it)
    PREPARING = "Preparing"
    CAPTURING = "Capturing"  # every participant snapshots its state (the stack is paused)
    PERSISTING = "Persisting"  # every upload written and verified (snapshot: resumed already; sync: still paused)
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
