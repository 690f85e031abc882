"""What is stored under ``checkpoints/`` at one location, read and written in the protocol's words.

A :class:`CheckpointStore` wraps one :class:`~gym_services.control.storage.Storage` and is the only code that
reads or writes the objects of a checkpoint (removing them is :mod:`.retention`'s job, over this store's reads).
Its verbs name checkpoints, participants, packs and restores; the keys they live at are built in :mod:`.layout`
and never cross this class's surface, with one exception the protocol makes: the participant manifest's name
(``PersistResponse.manifest_key``, a global manifest's entries, ``RestoreRequest.manifest_key``) travels from the
participant that wrote it to the one that restores it, and :meth:`CheckpointStore.manifest_key` names the global
manifest in reports. Its callers:

- the coordinator (:mod:`gym_services.coordination.coordinator`) claims an id, verifies what every
  participant persisted, publishes the global manifest, records a failure, and settles a restore's decision;
- a participant's control plane (:mod:`.plane`, :mod:`.packs`, :mod:`.records`) writes its reuse intent, packs and
  participant manifest, reads them back at restore and follows a restore's decision when its lease runs out;
- ``gymckpt checkpoints`` lists and shows; deletion and pruning (the CLI, the operator) go through :mod:`.retention`.

A checkpoint is *in flight* while it is claimed, unpublished, without a tombstone and its claim is younger
than :data:`~gym_services.control.protocol.CHECKPOINT_IN_FLIGHT_S` (plus
:data:`~gym_services.control.protocol.CLOCK_SKEW_S`): its coordinator refuses to publish it after that
bound, so an older unpublished checkpoint is abandoned and its objects are orphans. A transaction its
coordinator knows has failed writes a ``failed`` tombstone at once (:meth:`CheckpointStore.record_failure`),
so its objects are reclaimed without waiting for that bound.

Every method blocks (storage I/O): call them in a thread from async code.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from gym_services.control import layout
from gym_services.control.manifests import (
    encode_packed_manifest,
    manifest_records,
    parse_claim,
    parse_decision,
    parse_global_manifest,
    parse_participant_manifest,
    parse_reuse_intent,
    parse_tombstone,
    sha256_hex,
)
from gym_services.control.models import (
    SCHEMA_VERSION,
    CheckpointClaim,
    GlobalManifest,
    PackedManifest,
    PackEntry,
    ParticipantManifest,
    PersistResponse,
    RecordEntry,
    RestoreDecision,
    ReuseIntent,
    Tombstone,
)
from gym_services.control.participant import InvalidState
from gym_services.control.protocol import CHECKPOINT_IN_FLIGHT_S, CLOCK_SKEW_S, Decision
from gym_services.control.storage import AlreadyExists, NotFound, Storage


class CheckpointRefused(Exception):
    """The store refuses a step of a transaction (an id taken or deleted, a manifest that does not check out)."""


@dataclass(frozen=True)
class CheckpointState:
    """What storage says about one checkpoint id."""

    checkpoint_id: str
    manifest: GlobalManifest | None
    claim: CheckpointClaim | None
    tombstone: Tombstone | None

    @property
    def published(self) -> bool:
        return self.manifest is not None

    def in_flight(self, now: float | None = None) -> bool:
        """Claimed, unpublished, not deleted, failed or abandoned, and still within the bound to publish."""
        if self.published or self.tombstone is not None or self.claim is None:
            return False
        now = time.time() if now is None else now
        return now < self.in_flight_until

    @property
    def in_flight_until(self) -> float:
        """When it stops counting as in flight (its claim's time plus the bound and the clock skew)."""
        return (self.claim.created_at if self.claim else 0.0) + CHECKPOINT_IN_FLIGHT_S + CLOCK_SKEW_S


@dataclass(frozen=True)
class Published:
    """What :meth:`CheckpointStore.publish` stored: the manifest that holds, its name (for reports) and size."""

    key: str
    manifest: GlobalManifest
    size: int


@dataclass(frozen=True)
class StoredManifest:
    """A participant manifest as :meth:`CheckpointStore.write_participant_manifest` stored it: the name the protocol
    reports it under (``PersistResponse.manifest_key``), its digest and its size."""

    key: str
    sha256: str
    size: int


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


class CheckpointStore:
    """The checkpoints at one location (module docstring)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    @property
    def url(self) -> str:
        return self.storage.url

    def _optional(self, key: str) -> bytes | None:
        try:
            return self.storage.get(key)
        except NotFound:
            return None

    # --- reading ---------------------------------------------------------------------

    def published(self, checkpoint_id: str) -> GlobalManifest | None:
        """The global manifest, or None while (or when) the checkpoint is unpublished."""
        data = self._optional(layout.global_manifest_key(checkpoint_id))
        return parse_global_manifest(data) if data is not None else None

    @staticmethod
    def manifest_key(checkpoint_id: str) -> str:
        """The name of a checkpoint's global manifest, for reports and messages (read it with :meth:`published`)."""
        return layout.global_manifest_key(checkpoint_id)

    def is_published(self, checkpoint_id: str) -> bool:
        return self.storage.exists(layout.global_manifest_key(checkpoint_id))

    def state(self, checkpoint_id: str) -> CheckpointState:
        """Its global manifest, claim and tombstone (each None when absent). Raises
        :class:`~gym_services.control.participant.InvalidState` when one of them cannot be parsed."""
        claim = self._optional(layout.claim_key(checkpoint_id))
        tombstone = self._optional(layout.tombstone_key(checkpoint_id))
        return CheckpointState(
            checkpoint_id,
            self.published(checkpoint_id),
            parse_claim(claim) if claim is not None else None,
            parse_tombstone(tombstone, checkpoint_id) if tombstone is not None else None,
        )

    def checkpoint_ids(self) -> list[str]:
        return self.storage.list_folders(layout.CHECKPOINTS)

    def checkpoints(self) -> list[tuple[str, GlobalManifest | None]]:
        """Checkpoint ids here with their manifest (None when incomplete or unreadable)."""
        out: list[tuple[str, GlobalManifest | None]] = []
        for cid in self.checkpoint_ids():
            try:
                out.append((cid, self.published(cid)))
            except InvalidState:
                out.append((cid, None))
        return out

    def reuse_intents(self, checkpoint_id: str) -> list[ReuseIntent]:
        """The reuse intents its participants wrote (checkpoints that reference earlier packs)."""
        intents = []
        for key in self.storage.list(layout.participants_prefix(checkpoint_id)):
            if layout.is_reuse_intent(key) and (data := self._optional(key)) is not None:
                intents.append(parse_reuse_intent(data, checkpoint_id))
        return intents

    # --- a checkpoint transaction ----------------------------------------------------

    def claim(
        self, checkpoint_id: str, transaction_id: str, claimed_by: str, participants: list[str]
    ) -> tuple[GlobalManifest | None, float]:
        """Make ``checkpoint_id`` name this transaction, with a conditional put (of two transactions racing for
        one id exactly one gets it).

        Returns the published manifest when this very transaction already completed (a repeat), and the time
        (``time.time()``) after which it may no longer be published: the claim's time plus
        :data:`~gym_services.control.protocol.CHECKPOINT_IN_FLIGHT_S`. Raises :class:`CheckpointRefused` when the id
        belongs to another transaction, was deleted, failed or abandoned (a tombstone), or its claim is older
        than that bound.
        """
        published = self.published(checkpoint_id)
        if published is None and self.storage.exists(layout.tombstone_key(checkpoint_id)):
            raise CheckpointRefused(
                f"checkpoint id {checkpoint_id} at {self.url} was deleted, failed or abandoned; nothing was paused or "
                "written: choose another checkpoint id"
            )
        if published is not None and published.transaction_id != transaction_id:
            raise CheckpointRefused(
                f"checkpoint {checkpoint_id} already exists at {self.url} (published {_when(published.created_at)}"
                + (f" by transaction {published.transaction_id}" if published.transaction_id else "")
                + "); nothing was paused or written: choose another checkpoint id"
            )
        claim = self._held_claim(
            CheckpointClaim(
                schema_version=SCHEMA_VERSION,
                checkpoint_id=checkpoint_id,
                transaction_id=transaction_id,
                claimed_by=claimed_by,
                created_at=time.time(),
                participants=participants,
            ),
            published is not None,
        )
        publish_by = claim.created_at + CHECKPOINT_IN_FLIGHT_S
        if published is None and time.time() > publish_by:
            raise CheckpointRefused(
                f"checkpoint id {checkpoint_id} at {self.url} was claimed by this transaction "
                f"{_when(claim.created_at)}, more than {CHECKPOINT_IN_FLIGHT_S / 3600:g} h ago, and never published: "
                "it is abandoned (deletion may remove its objects); nothing was paused or written: choose another "
                "checkpoint id"
            )
        return published, publish_by

    def _held_claim(self, claim: CheckpointClaim, published: bool) -> CheckpointClaim:
        """``claim`` written if no claim is there; the one there when it names the same transaction."""
        key = layout.claim_key(claim.checkpoint_id)
        try:
            self.storage.put_if_absent(key, claim.model_dump_json(indent=1).encode())
        except AlreadyExists:
            held = parse_claim(self.storage.get(key))
            if held.transaction_id != claim.transaction_id:
                state = "published" if published else "not published: running, or interrupted"
                raise CheckpointRefused(
                    f"checkpoint id {claim.checkpoint_id} at {self.url} already names another transaction "
                    f"({held.transaction_id}, by {held.claimed_by}, {_when(held.created_at)}; {state}); nothing was "
                    "paused or written: choose another checkpoint id, or repeat that transaction with its id"
                ) from None
            return held
        return claim

    def verify_persisted(self, checkpoint_id: str, participant_id: str, answer: PersistResponse) -> None:
        """The participant manifest ``persist`` reported is where this participant's manifest of this checkpoint
        belongs, matches its digest, lists as many records as it said, and every pack it lists (written or reused)
        is stored whole. Raises :class:`CheckpointRefused`."""
        key = layout.participant_manifest_key(checkpoint_id, participant_id)
        if answer.manifest_key != key:
            raise CheckpointRefused(
                f"participant {participant_id} reported a manifest at {answer.manifest_key}, not at {key}"
            )
        data = self._optional(key)
        if data is None:
            raise CheckpointRefused(f"participant {participant_id} reported a manifest that is not in storage")
        if sha256_hex(data) != answer.manifest_sha256:
            raise CheckpointRefused(f"participant {participant_id}'s manifest does not match the digest it reported")
        manifest = parse_participant_manifest(data)
        if manifest.checkpoint_id != checkpoint_id or manifest.participant_id != participant_id:
            raise CheckpointRefused(
                f"participant {participant_id}'s manifest names {manifest.participant_id}/{manifest.checkpoint_id}"
            )
        listed = manifest_records(manifest)
        if listed != answer.records:
            raise CheckpointRefused(
                f"participant {participant_id}'s manifest lists {listed} records, persist said {answer.records}"
            )
        if isinstance(manifest, PackedManifest):
            for pack in manifest.packs:
                stored = self.pack_size(pack)
                if stored != pack.size:
                    what = "missing" if stored is None else f"{stored} bytes, not {pack.size}"
                    raise CheckpointRefused(f"participant {participant_id}'s pack {pack.key} is {what}")

    def publish(self, manifest: GlobalManifest, publish_by: float = float("inf")) -> Published:
        """Write the global manifest, last and only if absent: its presence is the checkpoint.

        CheckpointRefused after ``publish_by`` (:meth:`claim`: deletion may by then treat the checkpoint as abandoned)
        and once a tombstone exists. A conditional put retried after its answer was lost (S3 died right after
        storing it) finds the manifest its first try wrote: this transaction's, so published; anyone else's is
        a conflict (:class:`CheckpointRefused`).
        """
        checkpoint_id = manifest.checkpoint_id
        if time.time() > publish_by:
            raise CheckpointRefused(
                f"checkpoint {checkpoint_id} was not published within {CHECKPOINT_IN_FLIGHT_S / 3600:g} h of its "
                "claim; it never will be (deletion may already remove its objects): take a new checkpoint"
            )
        if self.storage.exists(layout.tombstone_key(checkpoint_id)):
            raise CheckpointRefused(
                f"checkpoint {checkpoint_id} was deleted or failed while it was written; it is never published"
            )
        key = layout.global_manifest_key(checkpoint_id)
        data = manifest.model_dump_json(indent=1).encode()
        try:
            self.storage.put_if_absent(key, data)
        except AlreadyExists:
            stored = self.published(checkpoint_id)
            if stored is None or stored.transaction_id != manifest.transaction_id:
                raise CheckpointRefused(f"checkpoint {checkpoint_id} was published by someone else") from None
            return Published(key, stored, len(data))
        return Published(key, manifest, len(data))

    def record_failure(self, checkpoint_id: str, transaction_id: str, error: str, by: str) -> bool:
        """The coordinator knows this transaction failed before it published: a ``failed`` tombstone, so the id
        is never published and its objects are no longer in flight (``checkpoints delete`` and ``prune``
        reclaim them at once). Only for the transaction the claim names; False when it does not or a
        tombstone is already there."""
        data = self._optional(layout.claim_key(checkpoint_id))
        if data is None or parse_claim(data).transaction_id != transaction_id:
            return False
        return self.write_tombstone(checkpoint_id, "failed", f"{by}: {error}"[:500])

    def write_tombstone(
        self, checkpoint_id: str, reason: Literal["deleted", "abandoned", "failed"], by: str, now: float | None = None
    ) -> bool:
        """Mark the id as over (``docs/protocol.md``, "Deleting checkpoints"): never published (again), its claim
        refuses every transaction. False when a tombstone is already there (the first one holds)."""
        tombstone = Tombstone(
            schema_version=SCHEMA_VERSION,
            checkpoint_id=checkpoint_id,
            reason=reason,
            by=by,
            created_at=time.time() if now is None else now,
        )
        try:
            self.storage.put_if_absent(
                layout.tombstone_key(checkpoint_id), tombstone.model_dump_json(indent=1).encode()
            )
        except AlreadyExists:
            return False
        return True

    # --- what a participant writes -------------------------------------------------------

    def put_reuse_intent(self, checkpoint_id: str, participant_id: str, packs: Iterable[PackEntry]) -> int:
        """Name the packs of earlier checkpoints this participant's checkpoint will reference, before it relies on
        them (deletion keeps what an in-flight checkpoint's intents name); returns the intent's size."""
        intent = ReuseIntent(
            schema_version=SCHEMA_VERSION,
            checkpoint_id=checkpoint_id,
            participant_id=participant_id,
            created_at=time.time(),
            packs=sorted({p.key for p in packs}),
        )
        data = intent.model_dump_json(indent=1).encode()
        self.storage.put(layout.reuse_intent_key(checkpoint_id, participant_id), data)
        return len(data)

    def write_pack(self, checkpoint_id: str, participant_id: str, number: int, data: bytes) -> PackEntry:
        """Store a participant's pack ``number`` of a checkpoint; the entry its manifest lists it by."""
        entry = PackEntry(
            key=layout.pack_key(checkpoint_id, participant_id, number), sha256=sha256_hex(data), size=len(data)
        )
        self.storage.put(entry.key, data)
        return entry

    def pack_size(self, pack: PackEntry) -> int | None:
        """How many bytes of the pack are stored (None: none), with one metadata request."""
        return self.storage.size(pack.key)

    def write_participant_manifest(self, manifest: PackedManifest) -> StoredManifest:
        """The participant manifest, written last; a retried persist may replace it only while unpublished
        (:class:`~gym_services.control.storage.AlreadyExists` once published)."""
        checkpoint_id = manifest.checkpoint_id
        key = layout.participant_manifest_key(checkpoint_id, manifest.participant_id)
        data = encode_packed_manifest(manifest)
        try:
            self.storage.put_if_absent(key, data)
        except AlreadyExists:
            if self.is_published(checkpoint_id):
                raise AlreadyExists(
                    f"checkpoint {checkpoint_id} is already published; its manifests are final"
                ) from None
            self.storage.put(key, data)
        return StoredManifest(key, sha256_hex(data), len(data))

    # --- what a restore reads -------------------------------------------------------------

    def read_participant_manifest(
        self, checkpoint_id: str, manifest_key: str, sha256: str | None = None
    ) -> ParticipantManifest | PackedManifest:
        """The participant manifest a global manifest of ``checkpoint_id`` names, checked against its digest when
        given. Raises :class:`~gym_services.control.storage.NotFound` when it is missing and
        :class:`~gym_services.control.participant.InvalidState` when it is damaged, does not match, or the name is
        not one of that checkpoint's participant manifests."""
        participant_id = layout.participant_of_manifest(checkpoint_id, manifest_key)
        if participant_id is None:
            raise InvalidState(f"{manifest_key} is not a participant manifest of checkpoint {checkpoint_id}")
        data = self.storage.get(manifest_key)
        if sha256 is not None and sha256_hex(data) != sha256:
            raise InvalidState(
                f"participant manifest {manifest_key} does not match its digest in the checkpoint manifest"
            )
        manifest = parse_participant_manifest(data)
        if (manifest.checkpoint_id, manifest.participant_id) != (checkpoint_id, participant_id):
            raise InvalidState(
                f"participant manifest {manifest_key} names {manifest.participant_id}/{manifest.checkpoint_id}"
            )
        return manifest

    def read_pack(self, pack: PackEntry) -> bytes:
        """A pack a manifest lists, whole and matching its digest (InvalidState otherwise)."""
        try:
            blob = self.storage.get(pack.key)
        except NotFound:
            raise InvalidState(f"pack {pack.key} listed in the manifest is missing") from None
        if len(blob) != pack.size or sha256_hex(blob) != pack.sha256:
            raise InvalidState(f"pack {pack.key} is corrupt: digest or size does not match the manifest")
        return blob

    def read_record(self, manifest: ParticipantManifest, entry: RecordEntry) -> bytes:
        """One record of a version 1 manifest (an object of its own), matching its digest (InvalidState otherwise)."""
        try:
            blob = self.storage.get(layout.v1_record_key(manifest.checkpoint_id, manifest.participant_id, entry.key))
        except NotFound:
            raise InvalidState(f"record {entry.key} listed in the manifest is missing") from None
        if len(blob) != entry.size or sha256_hex(blob) != entry.sha256:
            raise InvalidState(f"record {entry.key} is corrupt: digest or size does not match the manifest")
        return blob

    # --- restore decisions ---------------------------------------------------------------

    def decision(self, checkpoint_id: str, restore_id: str) -> Decision | None:
        """A restore's settled outcome, or None while nobody has decided."""
        data = self._optional(layout.restore_decision_key(checkpoint_id, restore_id))
        return None if data is None else parse_decision(data, checkpoint_id, restore_id).decision

    def settle(self, checkpoint_id: str, restore_id: str, proposal: Decision, decided_by: str) -> Decision:
        """Write ``proposal`` as the restore's decision unless one exists; return the one that holds.

        A restore is all-or-nothing only if every participant ends the same way: the coordinator proposes
        ``resume`` once all restored, a participant whose lease runs out first proposes ``abort``; the
        conditional put lets exactly one win. Raises StorageError when storage cannot be reached and
        InvalidState for a malformed decision object.
        """
        body = RestoreDecision(
            schema_version=SCHEMA_VERSION,
            checkpoint_id=checkpoint_id,
            restore_id=restore_id,
            decision=proposal,
            decided_by=decided_by,
        )
        try:
            self.storage.put_if_absent(
                layout.restore_decision_key(checkpoint_id, restore_id), body.model_dump_json().encode()
            )
            return proposal
        except AlreadyExists:
            pass
        settled = self.decision(checkpoint_id, restore_id)
        if settled is None:  # pragma: no cover - put said it exists; a store that loses it is broken
            raise InvalidState(f"restore decision {restore_id} exists but cannot be read back")
        return settled

    def decisions(self, checkpoint_id: str) -> list[tuple[str, str, str]]:
        """(restore id, decision, decided by) of every restore of a checkpoint, for listings."""
        rows = []
        for key in self.storage.list(layout.restores_prefix(checkpoint_id)):
            restore_id = layout.restore_id_of(key)
            if restore_id is None:
                continue
            try:
                decided = parse_decision(self.storage.get(key), checkpoint_id, restore_id)
                rows.append((decided.restore_id, str(decided.decision), decided.decided_by))
            except (NotFound, InvalidState):
                rows.append((restore_id, "unreadable", ""))
        return rows
