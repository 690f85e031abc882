"""Which stored objects a checkpoint reads, and which of a checkpoint's objects others still read.

An incremental checkpoint (the ``snapshot`` method) references records in packs of earlier checkpoints
instead of writing them again; its global manifest lists those checkpoints in ``references``
(``docs/protocol.md``, "Records and manifests"). Whoever deletes a checkpoint's objects (retention,
``gymckpt checkpoints delete``, the operator) must keep every object another checkpoint reads:
:func:`kept_objects` says which, for the published ones (their manifests) and for the ones still being
written (their participants' reuse intents, written before they rely on an earlier pack).

Why the order matters (``docs/protocol.md``, "Deleting checkpoints"): a participant names the packs it
will reuse in its intent, *then* checks that the checkpoint it reuses from is still published. Deletion
removes that checkpoint's global manifest *first*, then reads the published readers, then lists and reads
intents. Either the participant sees the manifest gone (and reuses nothing) or deletion sees its intent.

A checkpoint is *in flight* while it is claimed, unpublished, without a tombstone and its claim is younger
than :data:`~gym_services.control.protocol.CHECKPOINT_IN_FLIGHT_S` (plus
:data:`~gym_services.control.protocol.CLOCK_SKEW_S`): its coordinator refuses to publish it after that
bound, so an older unpublished checkpoint is abandoned and its objects are orphans.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import ValidationError

from gym_services.control import layout
from gym_services.control.models import CheckpointClaim, GlobalManifest, PackedManifest, ReuseIntent, Tombstone
from gym_services.control.participant import InvalidState
from gym_services.control.protocol import CHECKPOINT_IN_FLIGHT_S, CLOCK_SKEW_S
from gym_services.control.records import parse_participant_manifest
from gym_services.control.storage import NotFound, Storage
from gym_services.coordination.coordinator import parse_claim, parse_global_manifest


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
        """Claimed, unpublished, not deleted or abandoned, and still within the bound to publish."""
        if self.published or self.tombstone is not None or self.claim is None:
            return False
        now = time.time() if now is None else now
        return now < self.in_flight_until

    @property
    def in_flight_until(self) -> float:
        """When it stops counting as in flight (its claim's time plus the bound and the clock skew)."""
        return (self.claim.created_at if self.claim else 0.0) + CHECKPOINT_IN_FLIGHT_S + CLOCK_SKEW_S


def _optional(storage: Storage, key: str) -> bytes | None:
    try:
        return storage.get(key)
    except NotFound:
        return None


def checkpoint_state(storage: Storage, checkpoint_id: str) -> CheckpointState:
    """Its global manifest, claim and tombstone (each None when absent). Raises
    :class:`~gym_services.control.participant.InvalidState` when one of them cannot be parsed."""
    manifest = _optional(storage, layout.global_manifest_key(checkpoint_id))
    claim = _optional(storage, layout.claim_key(checkpoint_id))
    tombstone = _optional(storage, layout.tombstone_key(checkpoint_id))
    try:
        parsed_tombstone = Tombstone.model_validate_json(tombstone) if tombstone is not None else None
    except ValidationError:
        raise InvalidState(f"checkpoint {checkpoint_id}'s tombstone is malformed") from None
    return CheckpointState(
        checkpoint_id,
        parse_global_manifest(manifest) if manifest is not None else None,
        parse_claim(claim) if claim is not None else None,
        parsed_tombstone,
    )


def objects_read_by(storage: Storage, checkpoint_id: str) -> set[str]:
    """Every object a restore of the published ``checkpoint_id`` reads: its manifests, its records or packs,
    and the packs of earlier checkpoints it reuses. Empty when it is not published.

    Raises :class:`~gym_services.control.participant.InvalidState` for a manifest that cannot be parsed
    (never guess what a damaged checkpoint references).
    """
    key = layout.global_manifest_key(checkpoint_id)
    try:
        manifest = parse_global_manifest(storage.get(key))
    except NotFound:
        return set()
    keys = {key}
    for participant in manifest.participants:
        keys.add(participant.manifest_key)
        try:
            parsed = parse_participant_manifest(storage.get(participant.manifest_key))
        except NotFound:
            continue  # already damaged: nothing more of it can be read
        if isinstance(parsed, PackedManifest):
            keys.update(p.key for p in parsed.packs)
        else:
            folder = participant.manifest_key.rsplit("/", 1)[0]
            keys.update(f"{folder}/records/{r.key}" for r in parsed.records)
    return keys


def kept_for_others(storage: Storage, checkpoint_id: str) -> dict[str, list[str]]:
    """Objects stored under ``checkpoint_id`` that other published checkpoints read: key -> their ids.

    Deleting ``checkpoint_id`` must leave these in place until every checkpoint listed is deleted too.
    """
    return _kept_by_published(storage, checkpoint_id)[0]


def _kept_by_published(storage: Storage, checkpoint_id: str) -> tuple[dict[str, list[str]], set[str]]:
    prefix = layout.checkpoint_prefix(checkpoint_id) + "/"
    kept: dict[str, list[str]] = {}
    published: set[str] = set()
    for other in storage.list_folders("checkpoints"):
        if other == checkpoint_id:
            continue
        try:
            manifest = parse_global_manifest(storage.get(layout.global_manifest_key(other)))
        except NotFound:
            continue  # unpublished: its reuse intents protect what it will read (kept_objects)
        except InvalidState:
            raise InvalidState(f"checkpoint {other}'s manifest is unreadable; cannot tell what it references") from None
        published.add(other)
        if checkpoint_id not in manifest.references:
            continue
        for key in objects_read_by(storage, other):
            if key.startswith(prefix):
                kept.setdefault(key, []).append(other)
    return kept, published


def reuse_intents(storage: Storage, checkpoint_id: str) -> list[ReuseIntent]:
    """The reuse intents its participants wrote (``snapshot`` checkpoints that reference earlier packs)."""
    intents = []
    for key in storage.list(layout.checkpoint_prefix(checkpoint_id) + "/participants/"):
        if not key.endswith("/reuses.json"):
            continue
        data = _optional(storage, key)
        if data is None:
            continue
        try:
            intents.append(ReuseIntent.model_validate_json(data))
        except ValidationError:
            raise InvalidState(f"reuse intent {key} is malformed; cannot tell what {checkpoint_id} will read") from None
    return intents


def kept_objects(storage: Storage, checkpoint_id: str, now: float | None = None) -> dict[str, list[str]]:
    """Objects stored under ``checkpoint_id`` that any other checkpoint reads or will read: key -> their ids.

    Published checkpoints first (their manifests), then those in flight (their reuse intents), each
    listed afresh: a checkpoint published or started meanwhile is seen by the second pass. Call it only
    after ``checkpoint_id``'s global manifest is gone (module docstring: the order is the guarantee).
    """
    prefix = layout.checkpoint_prefix(checkpoint_id) + "/"
    kept, published = _kept_by_published(storage, checkpoint_id)
    for other in storage.list_folders("checkpoints"):
        if other == checkpoint_id or other in published:
            continue
        state = checkpoint_state(storage, other)
        if state.published:  # published since the first pass
            for key in objects_read_by(storage, other):
                if key.startswith(prefix):
                    kept.setdefault(key, []).append(other)
        if not (state.published or state.in_flight(now)):
            continue
        for intent in reuse_intents(storage, other):
            for key in intent.packs:
                if key.startswith(prefix) and other not in kept.get(key, []):
                    kept.setdefault(key, []).append(other)
    return kept
