"""Wire formats of the control plane and the checkpoint files (``docs/protocol.md``).

Both ends use these models: the control routes parse requests and answer with responses
(:mod:`gym_services.control.routes`), the coordinator's client sends requests and parses
responses (:mod:`gym_services.coordination.client`); the file models are written by
:mod:`gym_services.control.records` and the coordinator. The vocabulary (roles, phases,
verbs, defaults) lives in :mod:`gym_services.control.protocol` and is re-exported here.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FieldSerializationInfo, SecretStr, field_serializer, model_validator

from gym_services.control.layout import PACK_KEY_PATTERN
from gym_services.control.protocol import (
    DEFAULT_LEASE_S,
    ROLE_ORDER,
    CheckpointMethod,
    CheckpointMode,
    Decision,
    PersistState,
    Phase,
    Role,
    Verb,
    VerifyMode,
)

__all__ = [  # re-exported vocabulary
    "ROLE_ORDER",
    "CheckpointMethod",
    "CheckpointMode",
    "Decision",
    "PersistState",
    "Phase",
    "Role",
    "VerifyMode",
]

SCHEMA_VERSION = 1
#: a participant manifest of the packed format: records packed into a few objects, indexed by
#: columns, the whole manifest gzip-compressed (``docs/protocol.md``, "Records and manifests")
PACKED_SCHEMA_VERSION = 2
#: participant manifest versions this code reads (1: one object per record, written before the packed format)
PARTICIPANT_SCHEMA_VERSIONS = frozenset({SCHEMA_VERSION, PACKED_SCHEMA_VERSION})
CHECKPOINT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
RECORD_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
_RECORD_KEY = re.compile(RECORD_KEY_PATTERN)
#: the context under which :class:`StorageGrant` serializes its token in clear (the control client only)
REVEAL_SECRETS = {"reveal_secrets": True}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Blocker(BaseModel):
    """Why a participant could not reach a boundary."""

    kind: str
    id: str
    detail: str = ""
    server: str | None = Field(
        default=None,
        description="the downstream server the blocked work waits on (an agent's tool call on a resources server); "
        "none: the reporting participant itself",
    )


#: sessions a :class:`ScopeReport` names in each list (its totals count them all)
SCOPE_NAMED = 20


class ScopedSession(BaseModel):
    session_id: str
    rollout_id: str | None = None


class ScopeReport(BaseModel):
    """The sessions a capture's scope did not keep by their rollout (``docs/protocol.md``, "Scope").

    ``dropped``: sessions of a rollout that is not one of the checkpoint's episodes; the checkpoint does not hold
    them, so a restore does not bring them back. ``unowned``: sessions seeded without identity headers; they belong
    to no rollout, so every checkpoint keeps them until they end. Each list names the first :data:`SCOPE_NAMED`.
    """

    dropped: list[ScopedSession] = Field(default_factory=list)
    dropped_total: int = Field(default=0, ge=0)
    unowned: list[ScopedSession] = Field(default_factory=list)
    unowned_total: int = Field(default=0, ge=0)

    def lines(self, participant_id: str) -> list[str]:
        """What a person reads about it (the CLI's result and ``gymckpt checkpoints show``); none when empty."""
        out = []
        if self.dropped_total:
            named = _named([f"{s.session_id} (rollout {s.rollout_id})" for s in self.dropped], self.dropped_total)
            out.append(
                f"{participant_id}: {self.dropped_total} sessions dropped (their rollouts are not among the "
                f"checkpoint's episodes; a restore will not bring them back): {named}"
            )
        if self.unowned_total:
            named = _named([s.session_id for s in self.unowned], self.unowned_total)
            out.append(
                f"{participant_id}: {self.unowned_total} sessions of no rollout kept (seeded without identity "
                f"headers: every checkpoint keeps them until they end): {named}"
            )
        return out


def _named(names: list[str], total: int) -> str:
    return ", ".join(names) + (f" and {total - len(names)} more" if total > len(names) else "")


class Replica(BaseModel):
    """Which replica of a replicated server a participant is (``docs/protocol.md``, "Replicas").

    Every replica is its own participant with its own records; ``group`` names the server all of them
    run (the chart's server name, the stack YAML's instance name), ``ordinal`` is the StatefulSet's pod
    ordinal (the local stack's instance suffix). A restore maps each checkpointed replica to the
    participant of the same group and ordinal, and refuses a stack whose replica count differs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: str = Field(min_length=1, max_length=253)
    ordinal: int = Field(ge=0)
    replicas: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordinal_in_range(self) -> Replica:
        if self.ordinal >= self.replicas:
            raise ValueError(f"ordinal {self.ordinal} is not below replicas {self.replicas}")
        return self


# --- requests --------------------------------------------------------------------


class PrepareRequest(_Strict):
    checkpoint_id: str = Field(pattern=CHECKPOINT_ID_PATTERN)
    deadline_s: float = Field(gt=0, le=3600, description="seconds from now to reach a boundary")
    lease_s: float = Field(default=DEFAULT_LEASE_S, gt=0, le=3600, description="pause ends by itself unless renewed")
    final: bool | None = Field(
        default=None,
        description="the checkpoint a termination takes: never resumed; the participant holds it until its process "
        "exits (docs/protocol.md, Termination); unset: false",
    )


class StorageGrant(_Strict):
    """The ``storage`` field of a capture or restore: the storage gateway's grant for this participant and
    transaction (:mod:`gym_services.control.storage.gateway`). The server hands the token back to the gateway its own
    config names (``storage.gateway_url``) to have each object's request signed; the token is no key to the store
    and names no endpoint the server would use. Never logged, never echoed in an answer."""

    token: SecretStr = Field(min_length=16, max_length=8192)

    @field_serializer("token", when_used="json")
    def _token(self, value: SecretStr, info: FieldSerializationInfo) -> str:
        """Masked, except in a request the control client sends (context :data:`REVEAL_SECRETS`)."""
        return value.get_secret_value() if (info.context or {}).get("reveal_secrets") else str(value)


class CaptureRequest(_Strict):
    """``capture``: the scope, and where the captured records will be written."""

    checkpoint_id: str = Field(pattern=CHECKPOINT_ID_PATTERN)
    location: str = Field(min_length=1)
    episodes: list[str] | None = Field(default=None, description="rollouts the controller continues; all when null")
    storage: StorageGrant | None = Field(
        default=None, description="the storage gateway's grant; without it the server's own storage config"
    )
    final: bool | None = Field(
        default=None,
        description="the checkpoint became final after this participant prepared it (another holds it as final): "
        "never resumed here either (docs/protocol.md, Termination); unset: as prepared",
    )


class CheckpointRef(_Strict):
    checkpoint_id: str = Field(pattern=CHECKPOINT_ID_PATTERN)


class RestoreRequest(_Strict):
    checkpoint_id: str = Field(pattern=CHECKPOINT_ID_PATTERN)
    location: str = Field(min_length=1)
    manifest_key: str = Field(min_length=1)
    manifest_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    lease_s: float = Field(default=DEFAULT_LEASE_S, gt=0, le=3600)
    storage: StorageGrant | None = Field(
        default=None, description="the storage gateway's grant; without it the server's own storage config"
    )
    restore_id: str | None = Field(
        default=None,
        pattern=CHECKPOINT_ID_PATTERN,
        description="names the restore transaction; with it, a participant whose lease runs out asks the "
        "decision object in storage whether to resume or undo",
    )


class RetireRequest(_Strict):
    rollout_id: str = Field(min_length=1)
    attempt: int = Field(ge=0)


# --- responses -------------------------------------------------------------------


class PrepareResponse(BaseModel):
    checkpoint_id: str
    participant_id: str
    role: Role
    status: Literal[Phase.PREPARED, Phase.BLOCKED]
    blockers: list[Blocker] = Field(default_factory=list)
    waited_s: float = 0.0
    final: bool | None = Field(
        default=None,
        description="this participant holds the checkpoint as final (it is terminating): the coordinator takes the "
        "whole checkpoint as final (docs/protocol.md, Termination); unset: false",
    )


class PersistResponse(BaseModel):
    """The answer of ``persist``: the participant manifest, written and verified."""

    checkpoint_id: str
    participant_id: str
    role: Role
    manifest_key: str
    manifest_sha256: str
    manifest_size: int
    records: int
    bytes: int = Field(description="bytes of the records this checkpoint holds, reused ones included")
    episodes: list[str] = Field(default_factory=list, description="rollouts with records here")
    duration_s: float = 0.0
    objects: int = Field(default=0, description="objects written, the participant manifest included")
    written_bytes: int = Field(default=0, description="bytes written, the participant manifest included")
    reused: int = Field(default=0, description="records referenced in an earlier checkpoint's packs, not rewritten")
    references: list[str] = Field(default_factory=list, description="earlier checkpoints whose packs this one reads")
    scope: ScopeReport = Field(default_factory=ScopeReport, description="sessions the scope did not keep by rollout")


class CaptureResponse(BaseModel):
    """``capture``: what was captured under the pause; ``persist`` writes its records."""

    checkpoint_id: str
    participant_id: str
    role: Role
    records: int
    episodes: list[str] = Field(default_factory=list, description="rollouts with records here")
    duration_s: float = 0.0
    scope: ScopeReport = Field(default_factory=ScopeReport, description="sessions the scope did not keep by rollout")


class RestoreResponse(BaseModel):
    checkpoint_id: str
    participant_id: str
    role: Role
    records: int
    bytes: int
    episodes: dict[str, int] = Field(default_factory=dict, description="rollout id -> attempt now in force")
    duration_s: float = 0.0


class PhaseResponse(BaseModel):
    checkpoint_id: str | None
    participant_id: str
    role: Role
    phase: Phase
    detail: str = ""


class RetireResponse(BaseModel):
    rollout_id: str
    attempt: int
    participant_id: str
    retired: bool


class PersistStatus(BaseModel):
    """A participant's background upload of a captured checkpoint, as ``status`` shows it."""

    checkpoint_id: str
    state: PersistState
    records: int
    encoded: int = 0
    objects: int = 0
    written_bytes: int = 0
    reused: int = 0
    elapsed_s: float = 0.0
    error: str | None = None


class TerminationStatus(BaseModel):
    """A terminating server (``docs/protocol.md``, "Termination"): the signal, the deadline, the final checkpoint."""

    signal: str = Field(description="SIGTERM (or the signal that began it)")
    signalled_at: float = Field(description="unix time of the signal")
    deadline_at: float = Field(description="unix time the server exits whatever happens")
    left_s: float = Field(ge=0, description="seconds left until the deadline")
    grace_s: float = Field(gt=0, description="the server's termination grace")
    final_checkpoint_id: str | None = Field(
        default=None, description="the final checkpoint this server persisted its part of (it exits at once)"
    )


class StatusResponse(BaseModel):
    participant_id: str
    server: str
    role: Role
    checkpoint_mode: CheckpointMode
    checkpoint_verify: VerifyMode
    phase: Phase
    checkpoint_id: str | None
    lease_remaining_s: float | None
    admission_open: bool
    inflight: int
    live: dict[str, Any]
    blockers: list[Blocker]
    last_event: str | None = None
    persist: PersistStatus | None = Field(default=None, description="the newest background upload, if any")
    terminating: TerminationStatus | None = Field(
        default=None, description="the server got a termination signal and holds its state for a final checkpoint"
    )


# --- files -----------------------------------------------------------------------


class RecordEntry(_Strict):
    key: str = Field(pattern=RECORD_KEY_PATTERN)
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(ge=0)
    rollout_id: str | None = None
    attempt: int | None = Field(default=None, ge=0)


class ParticipantManifest(_Strict):
    """Version 1 (the ``sync`` method): written after the participant's records; lists them with digests."""

    schema_version: int
    kind: Literal["gym-checkpoint/participant-manifest"] = "gym-checkpoint/participant-manifest"
    checkpoint_id: str
    participant_id: str
    server: str
    role: Role
    checkpoint_mode: CheckpointMode
    checkpoint_verify: VerifyMode
    created_at: float
    records: list[RecordEntry]
    meta: dict[str, Any] = Field(default_factory=dict)


class PackEntry(_Strict):
    """One pack object: records laid end to end, verified as a whole by its digest."""

    key: str = Field(pattern=PACK_KEY_PATTERN)
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(ge=0)


class PackedRecords(_Strict):
    """The record index of a packed manifest, by columns (record ``i`` is ``keys[i]``, ...).

    A record is bytes ``offsets[i]`` to ``offsets[i] + sizes[i]`` of pack ``packs[i]`` (a position
    in the manifest's ``packs``): written by this checkpoint, or reused from an earlier one.
    """

    keys: list[str]
    rollout_ids: list[str | None]
    attempts: list[int | None]
    packs: list[int]
    offsets: list[int]
    sizes: list[int]

    @model_validator(mode="after")
    def _columns(self) -> PackedRecords:
        n = len(self.keys)
        if any(len(c) != n for c in (self.rollout_ids, self.attempts, self.packs, self.offsets, self.sizes)):
            raise ValueError("record columns differ in length")
        if len(set(self.keys)) != n:
            raise ValueError("duplicate record keys")
        if any(not _RECORD_KEY.match(k) for k in self.keys):
            raise ValueError("invalid record key")
        if any(a is not None and a < 0 for a in self.attempts) or any(
            x < 0 for x in (*self.offsets, *self.sizes, *self.packs)
        ):
            raise ValueError("negative attempt, pack, offset or size")
        return self


class PackedManifest(_Strict):
    """Version 2 (the packed format): written after the packs it lists, gzip-compressed JSON.

    ``packs`` are the objects the records are in, this checkpoint's own and those of earlier
    checkpoints it reuses (``reuses``: their ids); every pack is verified by its digest at restore.
    """

    schema_version: Literal[2]
    kind: Literal["gym-checkpoint/participant-manifest"] = "gym-checkpoint/participant-manifest"
    checkpoint_id: str
    participant_id: str
    server: str
    role: Role
    checkpoint_mode: CheckpointMode
    checkpoint_verify: VerifyMode
    created_at: float
    packs: list[PackEntry]
    records: PackedRecords
    reuses: list[str] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _in_packs(self) -> PackedManifest:
        sizes = [p.size for p in self.packs]
        for pack, offset, size in zip(self.records.packs, self.records.offsets, self.records.sizes, strict=True):
            if pack >= len(sizes) or offset + size > sizes[pack]:
                raise ValueError("a record lies outside its pack")
        if len({p.key for p in self.packs}) != len(self.packs):
            raise ValueError("a pack is listed twice")
        return self


class ManifestParticipant(_Strict):
    participant_id: str
    role: Role
    replica: Replica | None = Field(default=None, description="which replica of which server (absent: not replicated)")
    manifest_key: str
    manifest_sha256: str = Field(pattern=SHA256_PATTERN)
    manifest_size: int = Field(ge=0)
    records: int = Field(ge=0)
    bytes: int = Field(ge=0)
    objects: int = Field(default=0, ge=0)
    written_bytes: int = Field(default=0, ge=0)
    reused: int = Field(default=0, ge=0)
    scope: ScopeReport = Field(default_factory=ScopeReport, description="sessions the scope did not keep by rollout")


class RestoreDecision(_Strict):
    """The outcome of one restore transaction, written once with a conditional put (``docs/protocol.md``).

    The coordinator writes ``resume`` after every participant restored; a participant whose lease
    ran out first writes ``abort``. Whichever lands first is the outcome for everyone, so a restore
    is installed everywhere or nowhere even when the coordinator dies halfway through resuming.
    """

    schema_version: int
    kind: Literal["gym-checkpoint/restore-decision"] = "gym-checkpoint/restore-decision"
    checkpoint_id: str
    restore_id: str
    decision: Decision
    decided_by: str


class CheckpointClaim(_Strict):
    """Written first by the coordinator with a conditional put: the one transaction a checkpoint id names.

    A checkpoint or restore of another transaction under the same id is refused before anything is
    paused; the same transaction run again (an operator restarted mid-checkpoint) carries on.
    """

    schema_version: int
    kind: Literal["gym-checkpoint/checkpoint-claim"] = "gym-checkpoint/checkpoint-claim"
    checkpoint_id: str
    transaction_id: str = Field(min_length=1, max_length=253)
    claimed_by: str = Field(description="who ran it: the CLI on a host, or a Checkpoint resource")
    created_at: float
    participants: list[str] = Field(default_factory=list)


class ReuseIntent(_Strict):
    """Written by a participant before it relies on packs of earlier checkpoints (the packed format).

    Deletion keeps every pack an in-flight checkpoint's intents name (``docs/protocol.md``, "Deleting
    checkpoints"); once that checkpoint is published, its manifests protect them instead.
    """

    schema_version: int
    kind: Literal["gym-checkpoint/reuse-intent"] = "gym-checkpoint/reuse-intent"
    checkpoint_id: str
    participant_id: str
    created_at: float
    packs: list[str] = Field(default_factory=list, description="pack keys of earlier checkpoints it may reference")


class Tombstone(_Strict):
    """This checkpoint id is over: deleted (by retention or ``gymckpt checkpoints delete``), failed (its
    coordinator knew its transaction failed before publishing) or abandoned (its transaction was cancelled).
    It is never published again and its claim refuses every transaction; its objects are removed as soon as
    no other checkpoint reads them."""

    schema_version: int
    kind: Literal["gym-checkpoint/tombstone"] = "gym-checkpoint/tombstone"
    checkpoint_id: str
    reason: Literal["deleted", "abandoned", "failed"]
    by: str = ""
    created_at: float


class GlobalManifest(_Strict):
    """Written last by the coordinator with a conditional put: its presence is the checkpoint."""

    schema_version: int
    kind: Literal["gym-checkpoint/checkpoint-manifest"] = "gym-checkpoint/checkpoint-manifest"
    checkpoint_id: str
    transaction_id: str | None = Field(
        default=None, description="the claim's transaction (none: written before claims)"
    )
    created_at: float
    participants: list[ManifestParticipant]
    episodes: list[str] | None = None
    controller: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)
    bytes: int = 0
    method: CheckpointMethod = CheckpointMethod.SYNC
    references: list[str] = Field(
        default_factory=list, description="earlier checkpoints whose objects this one reads (never delete them first)"
    )


# --- verbs -----------------------------------------------------------------------

#: what each control verb takes and answers: the control routes parse the request model and
#: answer with the response model; the coordinator's client sends the one and parses the other
VERB_MODELS: dict[Verb, tuple[type[BaseModel] | None, type[BaseModel]]] = {
    Verb.STATUS: (None, StatusResponse),
    Verb.PREPARE: (PrepareRequest, PrepareResponse),
    Verb.CAPTURE: (CaptureRequest, CaptureResponse),
    Verb.PERSIST: (CheckpointRef, PersistResponse),
    Verb.RESUME: (CheckpointRef, PhaseResponse),
    Verb.ABORT: (CheckpointRef, PhaseResponse),
    Verb.RESTORE: (RestoreRequest, RestoreResponse),
    Verb.RETIRE: (RetireRequest, RetireResponse),
    Verb.LEASE: (CheckpointRef, PhaseResponse),
}
