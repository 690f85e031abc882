"""What is stored under ``checkpoints/`` at one location, and the only code that writes or removes it.

A :class:`CheckpointStore` wraps one :class:`~gym_services.control.storage.Storage` and knows the layout
(:mod:`.layout`, ``docs/protocol.md``, "Records and manifests"). Everyone who touches stored checkpoints
goes through it:

- the coordinator (:mod:`gym_services.coordination.coordinator`) claims an id, verifies what every
  participant persisted, publishes the global manifest, records a failure, and settles a restore's decision;
- a participant's control plane (:mod:`.plane`, :mod:`.packs`) writes its reuse intent, packs and participant
  manifest, reads them back at restore and follows a restore's decision when its lease runs out;
- ``gymckpt checkpoints`` and the operator list, delete and prune.

Deletion never leaves a restorable checkpoint half deleted and never removes an object another checkpoint
reads or will read (``docs/protocol.md``, "Deleting checkpoints"):

1. a checkpoint still being written (:meth:`CheckpointState.in_flight`) is refused (:class:`CheckpointInFlight`),
   unless its caller knows its transaction is over (``abandoned``);
2. a tombstone is written: the id is never published again, its claim refuses every transaction;
3. the global manifest goes (without it the checkpoint is unknown to every restore and to every
   participant choosing what to reuse);
4. then what others read is worked out (:meth:`CheckpointStore.kept_objects`) and everything else goes,
   the participants' manifests first;
5. the claim and the tombstone go last, and only when nothing was kept: objects kept for others keep the
   id taken, so a new checkpoint under it can never overwrite them.

Why the order matters: a participant names the packs it will reuse in its intent, *then* checks that the
checkpoint it reuses from is still published (:mod:`.packs`). Deletion removes that checkpoint's global
manifest *first*, then reads the published readers, then lists and reads intents. Either the participant
sees the manifest gone (and reuses nothing) or deletion sees its intent.

A checkpoint is *in flight* while it is claimed, unpublished, without a tombstone and its claim is younger
than :data:`~gym_services.control.protocol.CHECKPOINT_IN_FLIGHT_S` (plus
:data:`~gym_services.control.protocol.CLOCK_SKEW_S`): its coordinator refuses to publish it after that
bound, so an older unpublished checkpoint is abandoned and its objects are orphans. A transaction its
coordinator knows has failed writes a ``failed`` tombstone at once (:meth:`CheckpointStore.record_failure`),
so its objects are reclaimed without waiting for that bound.

Every method blocks (storage I/O): call them in a thread from async code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from gym_services.control import layout
from gym_services.control.models import (
    SCHEMA_VERSION,
    CheckpointClaim,
    GlobalManifest,
    PackedManifest,
    PersistResponse,
    RestoreDecision,
    ReuseIntent,
    StatusResponse,
    Tombstone,
)
from gym_services.control.packs import sha256_hex
from gym_services.control.participant import InvalidState
from gym_services.control.protocol import CHECKPOINT_IN_FLIGHT_S, CLOCK_SKEW_S, Decision, Phase
from gym_services.control.records import manifest_records, parse_participant_manifest
from gym_services.control.storage import AlreadyExists, NotFound, Storage
from gym_services.control.storage.base import check_key


class CheckpointRefused(Exception):
    """The store refuses a step of a transaction (an id taken or deleted, a manifest that does not check out)."""


class CheckpointInFlight(Exception):
    """The checkpoint is being written (claimed, not published, within its bound to publish): not deleted."""


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
class Deleted:
    """What :meth:`CheckpointStore.delete` removed."""

    checkpoint_id: str
    objects: int
    published: bool  # whether a global manifest was there (a complete checkpoint, not a failed one's leftovers)
    kept: int = 0  # objects left in place because other checkpoints read them (claim and tombstone included)


@dataclass(frozen=True)
class Published:
    """What :meth:`CheckpointStore.publish` stored: the manifest that holds and its size."""

    key: str
    manifest: GlobalManifest
    size: int


def parse_global_manifest(data: bytes) -> GlobalManifest:
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"checkpoint manifest is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION:
        raise InvalidState("checkpoint manifest has an unsupported schema_version")
    try:
        return GlobalManifest.model_validate(raw)
    except ValidationError as exc:
        raise InvalidState(f"checkpoint manifest is malformed: {exc.errors(include_url=False)[:3]}") from None


def _parse_claim(data: bytes) -> CheckpointClaim:
    try:
        return CheckpointClaim.model_validate_json(data)
    except ValidationError as exc:
        raise InvalidState(f"checkpoint claim is malformed: {exc.errors(include_url=False)[:3]}") from None


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
        """Where the global manifest of a checkpoint is (its presence is the checkpoint)."""
        return layout.global_manifest_key(checkpoint_id)

    def is_published(self, checkpoint_id: str) -> bool:
        return self.storage.exists(layout.global_manifest_key(checkpoint_id))

    def state(self, checkpoint_id: str) -> CheckpointState:
        """Its global manifest, claim and tombstone (each None when absent). Raises
        :class:`~gym_services.control.participant.InvalidState` when one of them cannot be parsed."""
        claim = self._optional(layout.claim_key(checkpoint_id))
        tombstone = self._optional(layout.tombstone_key(checkpoint_id))
        try:
            parsed_tombstone = Tombstone.model_validate_json(tombstone) if tombstone is not None else None
        except ValidationError:
            raise InvalidState(f"checkpoint {checkpoint_id}'s tombstone is malformed") from None
        return CheckpointState(
            checkpoint_id,
            self.published(checkpoint_id),
            _parse_claim(claim) if claim is not None else None,
            parsed_tombstone,
        )

    def checkpoint_ids(self) -> list[str]:
        return self.storage.list_folders("checkpoints")

    def checkpoints(self) -> list[tuple[str, GlobalManifest | None]]:
        """Checkpoint ids here with their manifest (None when incomplete or unreadable)."""
        out: list[tuple[str, GlobalManifest | None]] = []
        for cid in self.checkpoint_ids():
            try:
                out.append((cid, self.published(cid)))
            except InvalidState:
                out.append((cid, None))
        return out

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
        claim = CheckpointClaim(
            schema_version=SCHEMA_VERSION,
            checkpoint_id=checkpoint_id,
            transaction_id=transaction_id,
            claimed_by=claimed_by,
            created_at=time.time(),
            participants=participants,
        )
        key = layout.claim_key(checkpoint_id)
        try:
            self.storage.put_if_absent(key, claim.model_dump_json(indent=1).encode())
        except AlreadyExists:
            held = _parse_claim(self.storage.get(key))
            if held.transaction_id != transaction_id:
                state = "published" if published is not None else "not published: running, or interrupted"
                raise CheckpointRefused(
                    f"checkpoint id {checkpoint_id} at {self.url} already names another transaction "
                    f"({held.transaction_id}, by {held.claimed_by}, {_when(held.created_at)}; {state}); nothing was "
                    "paused or written: choose another checkpoint id, or repeat that transaction with its id"
                ) from None
            claim = held
        publish_by = claim.created_at + CHECKPOINT_IN_FLIGHT_S
        if published is None and time.time() > publish_by:
            raise CheckpointRefused(
                f"checkpoint id {checkpoint_id} at {self.url} was claimed by this transaction "
                f"{_when(claim.created_at)}, more than {CHECKPOINT_IN_FLIGHT_S / 3600:g} h ago, and never published: "
                "it is abandoned (deletion may remove its objects); nothing was paused or written: choose another "
                "checkpoint id"
            )
        return published, publish_by

    def verify_persisted(self, checkpoint_id: str, participant_id: str, answer: PersistResponse) -> None:
        """The participant manifest ``persist`` reported is stored, matches its digest, lists as many records
        as it said, and every pack it lists (written or reused) is stored whole. Raises :class:`CheckpointRefused`."""
        try:
            data = self.storage.get(answer.manifest_key)
        except NotFound:
            raise CheckpointRefused(
                f"participant {participant_id} reported a manifest that is not in storage"
            ) from None
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
                stored = self.storage.size(pack.key)
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
        if data is None or _parse_claim(data).transaction_id != transaction_id:
            return False
        tombstone = Tombstone(
            schema_version=SCHEMA_VERSION,
            checkpoint_id=checkpoint_id,
            reason="failed",
            by=f"{by}: {error}"[:500],
            created_at=time.time(),
        )
        try:
            self.storage.put_if_absent(
                layout.tombstone_key(checkpoint_id), tombstone.model_dump_json(indent=1).encode()
            )
        except AlreadyExists:
            return False
        return True

    # --- what a participant writes -------------------------------------------------------

    def put_reuse_intent(self, intent: ReuseIntent) -> int:
        """Written before the participant relies on packs of earlier checkpoints; returns its size."""
        data = intent.model_dump_json(indent=1).encode()
        self.storage.put(layout.reuse_intent_key(intent.checkpoint_id, intent.participant_id), data)
        return len(data)

    def pack_key(self, checkpoint_id: str, participant_id: str, number: int) -> str:
        return layout.pack_key(checkpoint_id, participant_id, number)

    @staticmethod
    def checkpoint_of(key: str) -> str | None:
        """The checkpoint id a stored key lies under, or None."""
        return layout.checkpoint_of(key)

    def put_pack(self, key: str, data: bytes) -> None:
        self.storage.put(key, data)

    def stored_size(self, key: str) -> int | None:
        return self.storage.size(key)

    def put_participant_manifest(self, checkpoint_id: str, participant_id: str, data: bytes) -> str:
        """The participant manifest, if absent; a retried persist may replace it only while unpublished."""
        key = layout.participant_manifest_key(checkpoint_id, participant_id)
        try:
            self.storage.put_if_absent(key, data)
        except AlreadyExists:
            if self.is_published(checkpoint_id):
                raise AlreadyExists(
                    f"checkpoint {checkpoint_id} is already published; its manifests are final"
                ) from None
            self.storage.put(key, data)
        return key

    @staticmethod
    def v1_record_key(manifest_key: str, record_key: str) -> str:
        """Where a record of a version 1 participant manifest is: one object each, beside the manifest."""
        return f"{manifest_key.rsplit('/', 1)[0]}/records/{record_key}"

    def get(self, key: str) -> bytes:
        """One stored object (a participant manifest, a pack or a v1 record) by the key a manifest names."""
        return self.storage.get(key)

    # --- restore decisions ---------------------------------------------------------------

    def decision(self, checkpoint_id: str, restore_id: str) -> Decision | None:
        """A restore's settled outcome, or None while nobody has decided."""
        data = self._optional(layout.restore_decision_key(checkpoint_id, restore_id))
        if data is None:
            return None
        try:
            decided = RestoreDecision.model_validate(json.loads(data))
        except (UnicodeDecodeError, json.JSONDecodeError, ValidationError) as exc:
            raise InvalidState(
                f"restore decision {restore_id} of checkpoint {checkpoint_id} is malformed: {exc}"
            ) from None
        if decided.schema_version != SCHEMA_VERSION or (decided.checkpoint_id, decided.restore_id) != (
            checkpoint_id,
            restore_id,
        ):
            raise InvalidState(f"restore decision {restore_id} of checkpoint {checkpoint_id} does not match its key")
        return decided.decision

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
        for key in self.storage.list(f"{layout.checkpoint_prefix(checkpoint_id)}/restores"):
            if not key.endswith(".json"):
                continue
            try:
                decided = RestoreDecision.model_validate(json.loads(self.storage.get(key)))
                rows.append((decided.restore_id, str(decided.decision), decided.decided_by))
            except (NotFound, UnicodeDecodeError, json.JSONDecodeError, ValidationError):
                rows.append((key.rsplit("/", 1)[-1][: -len(".json")], "unreadable", ""))
        return rows

    # --- references: what other checkpoints read -------------------------------------------

    def objects_read_by(self, checkpoint_id: str) -> set[str]:
        """Every object a restore of the published ``checkpoint_id`` reads: its manifests, its records or packs,
        and the packs of earlier checkpoints it reuses. Empty when it is not published. Raises InvalidState
        for a manifest that cannot be parsed (never guess what a damaged checkpoint references)."""
        manifest = self.published(checkpoint_id)
        if manifest is None:
            return set()
        keys = {layout.global_manifest_key(checkpoint_id)}
        for participant in manifest.participants:
            keys.add(participant.manifest_key)
            data = self._optional(participant.manifest_key)
            if data is None:
                continue  # already damaged: nothing more of it can be read
            parsed = parse_participant_manifest(data)
            if isinstance(parsed, PackedManifest):
                keys.update(p.key for p in parsed.packs)
            else:
                keys.update(self.v1_record_key(participant.manifest_key, r.key) for r in parsed.records)
        return keys

    def kept_for_others(self, checkpoint_id: str) -> dict[str, list[str]]:
        """Objects stored under ``checkpoint_id`` that other published checkpoints read: key -> their ids."""
        return self._kept_by_published(checkpoint_id)[0]

    def _kept_by_published(self, checkpoint_id: str) -> tuple[dict[str, list[str]], set[str]]:
        prefix = layout.checkpoint_prefix(checkpoint_id) + "/"
        kept: dict[str, list[str]] = {}
        published: set[str] = set()
        for other in self.checkpoint_ids():
            if other == checkpoint_id:
                continue
            try:
                manifest = self.published(other)
            except InvalidState:
                raise InvalidState(
                    f"checkpoint {other}'s manifest is unreadable; cannot tell what it references"
                ) from None
            if manifest is None:
                continue  # unpublished: its reuse intents protect what it will read (kept_objects)
            published.add(other)
            if checkpoint_id not in manifest.references:
                continue
            for key in self.objects_read_by(other):
                if key.startswith(prefix):
                    kept.setdefault(key, []).append(other)
        return kept, published

    def reuse_intents(self, checkpoint_id: str) -> list[ReuseIntent]:
        """The reuse intents its participants wrote (checkpoints that reference earlier packs)."""
        intents = []
        for key in self.storage.list(layout.checkpoint_prefix(checkpoint_id) + "/participants/"):
            if not key.endswith("/reuses.json"):
                continue
            data = self._optional(key)
            if data is None:
                continue
            try:
                intents.append(ReuseIntent.model_validate_json(data))
            except ValidationError:
                raise InvalidState(
                    f"reuse intent {key} is malformed; cannot tell what {checkpoint_id} will read"
                ) from None
        return intents

    def kept_objects(self, checkpoint_id: str, now: float | None = None) -> dict[str, list[str]]:
        """Objects stored under ``checkpoint_id`` that any other checkpoint reads or will read: key -> their ids.

        Published checkpoints first (their manifests), then those in flight (their reuse intents), each listed
        afresh: a checkpoint published or started meanwhile is seen by the second pass. Call it only after
        ``checkpoint_id``'s global manifest is gone (module docstring: the order is the guarantee).
        """
        prefix = layout.checkpoint_prefix(checkpoint_id) + "/"
        kept, published = self._kept_by_published(checkpoint_id)
        for other in self.checkpoint_ids():
            if other == checkpoint_id or other in published:
                continue
            state = self.state(other)
            if state.published:  # published since the first pass
                for key in self.objects_read_by(other):
                    if key.startswith(prefix):
                        kept.setdefault(key, []).append(other)
            if not (state.published or state.in_flight(now)):
                continue
            for intent in self.reuse_intents(other):
                for key in intent.packs:
                    if key.startswith(prefix) and other not in kept.get(key, []):
                        kept.setdefault(key, []).append(other)
        return kept

    # --- deletion -------------------------------------------------------------------------

    def objects(self, checkpoint_id: str) -> list[str]:
        """Every key stored under one checkpoint, in deletion order (global manifest first, claim and tombstone
        last)."""
        keys = self.storage.list(check_key(layout.checkpoint_prefix(checkpoint_id)))
        markers = (layout.claim_key(checkpoint_id), layout.tombstone_key(checkpoint_id))

        def order(key: str) -> int:
            if key == layout.global_manifest_key(checkpoint_id):
                return 0
            if key.endswith("/manifest.json"):
                return 1
            return 3 if key in markers else 2

        return sorted(keys, key=lambda k: (order(k), k))

    def delete(self, checkpoint_id: str, *, abandoned: bool = False, by: str = "", now: float | None = None) -> Deleted:
        """Remove every object of ``checkpoint_id`` that no other checkpoint reads (none there: 0 objects).

        Raises :class:`CheckpointInFlight` for a checkpoint still being written, unless ``abandoned``: the caller knows
        its transaction is over for good. Idempotent: a deletion interrupted half-way is finished by running it
        again. Raises :class:`~gym_services.control.storage.StorageError` when storage refuses.
        """
        now = time.time() if now is None else now
        keys = self.objects(checkpoint_id)
        if not keys:
            return Deleted(checkpoint_id=checkpoint_id, objects=0, published=False)
        state = self.state(checkpoint_id)
        if state.in_flight(now) and not abandoned:
            claim = state.claim
            assert claim is not None
            raise CheckpointInFlight(
                f"checkpoint {checkpoint_id} at {self.url} is being written (claimed {time.ctime(claim.created_at)} by "
                f"{claim.claimed_by}, not published): its transaction may still publish it until "
                f"{time.ctime(state.in_flight_until)}; delete it once that transaction has failed (`gymckpt status`), "
                "or after that time"
            )
        tombstone_key = layout.tombstone_key(checkpoint_id)
        if state.tombstone is None:
            tombstone = Tombstone(
                schema_version=SCHEMA_VERSION,
                checkpoint_id=checkpoint_id,
                reason="abandoned" if abandoned and not state.published else "deleted",
                by=by,
                created_at=now,
            )
            self.storage.put(tombstone_key, tombstone.model_dump_json(indent=1).encode())
        removed = 0
        manifest_key = layout.global_manifest_key(checkpoint_id)
        if state.published:
            self.storage.delete(manifest_key)  # first: from here no restore and no new reuse finds it
            removed += 1
        kept = self.kept_objects(checkpoint_id, now)  # only after the manifest is gone (module docstring)
        markers = {layout.claim_key(checkpoint_id), tombstone_key}
        for key in keys:
            if key in kept or key in markers or key == manifest_key:
                continue
            self.storage.delete(key)
            removed += 1
        if kept:
            return Deleted(checkpoint_id, removed, state.published, kept=len(kept) + len(markers))
        for key in (layout.claim_key(checkpoint_id), tombstone_key):  # the tombstone last: a rerun still knows
            self.storage.delete(key)
            removed += key in keys  # the tombstone counts only when it was there before this call
        return Deleted(checkpoint_id=checkpoint_id, objects=removed, published=state.published)

    def prune(self, now: float | None = None) -> list[Deleted]:
        """Remove the leftovers of checkpoints that will never be published: failed, abandoned (unpublished and
        older than their bound to publish, or without a claim), or deleted with objects kept for others that
        nobody reads any more. Published and in-flight checkpoints are never touched."""
        now = time.time() if now is None else now
        out = []
        for checkpoint_id in self.checkpoint_ids():
            state = self.state(checkpoint_id)
            if state.published or state.in_flight(now):
                continue
            deleted = self.delete(checkpoint_id, now=now)
            if deleted.objects:
                out.append(deleted)
        return out


def restoring(statuses: Mapping[str, object], checkpoint_id: str) -> list[str]:
    """Participants (by id) whose restore of ``checkpoint_id`` is still under way: a checkpoint they read
    is not deleted. ``statuses`` is the coordinator's ``status()`` answer (errors are skipped)."""
    busy = (Phase.RESTORING, Phase.RESTORED)
    return sorted(
        pid
        for pid, status in statuses.items()
        if isinstance(status, StatusResponse) and status.checkpoint_id == checkpoint_id and status.phase in busy
    )
