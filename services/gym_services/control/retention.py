"""Deleting checkpoints and collecting their garbage, over the store's reads (``docs/protocol.md``, "Deleting
checkpoints").

A lifecycle of its own, as Velero keeps deletion and garbage collection in controllers of their own over one
backup store: ``gymckpt checkpoints delete`` and ``prune`` (:mod:`gym_services.commands.stack.catalog`) and the
operator's deletion of a ``Checkpoint`` (:mod:`gym_operator.handlers`) call :class:`Retention`. It reads through
the :class:`~gym_services.control.store.CheckpointStore` (manifests, claims, tombstones, reuse intents), writes
nothing but the tombstone (through the store), and lists and removes objects in the store's storage by the keys
:mod:`.layout` and the stored manifests name.

Deletion never leaves a restorable checkpoint half deleted and never removes an object another checkpoint
reads or will read:

1. a checkpoint still being written (:meth:`~gym_services.control.store.CheckpointState.in_flight`) is refused
   (:class:`CheckpointInFlight`), unless its caller knows its transaction is over (``abandoned``);
2. a tombstone is written: the id is never published again, its claim refuses every transaction;
3. the global manifest goes (without it the checkpoint is unknown to every restore and to every
   participant choosing what to reuse);
4. then what others read is worked out (:meth:`Retention.kept_objects`) and everything else goes,
   the participants' manifests first;
5. the claim and the tombstone go last, and only when nothing was kept: objects kept for others keep the
   id taken, so a new checkpoint under it can never overwrite them.

Why the order matters: a participant names the packs it will reuse in its intent, *then* checks that the
checkpoint it reuses from is still published (:mod:`.packs`). Deletion removes that checkpoint's global
manifest *first*, then reads the published readers, then lists and reads intents. Either the participant
sees the manifest gone (and reuses nothing) or deletion sees its intent.

Every method blocks (storage I/O): call them in a thread from async code.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from gym_services.control import layout
from gym_services.control.models import PackedManifest, StatusResponse
from gym_services.control.participant import InvalidState
from gym_services.control.protocol import Phase
from gym_services.control.storage import NotFound
from gym_services.control.storage.base import check_key
from gym_services.control.store import CheckpointStore


class CheckpointInFlight(Exception):
    """The checkpoint is being written (claimed, not published, within its bound to publish): not deleted."""


@dataclass(frozen=True)
class Deleted:
    """What :meth:`Retention.delete` removed."""

    checkpoint_id: str
    objects: int
    published: bool  # whether a global manifest was there (a complete checkpoint, not a failed one's leftovers)
    kept: int = 0  # objects left in place because other checkpoints read them (claim and tombstone included)


class Retention:
    """Deletion and pruning of the checkpoints at one store's location (module docstring)."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self._storage = store.storage

    # --- references: what other checkpoints read -------------------------------------------

    def objects_read_by(self, checkpoint_id: str) -> set[str]:
        """Every object a restore of the published ``checkpoint_id`` reads: its manifests, its records or packs,
        and the packs of earlier checkpoints it reuses. Empty when it is not published. Raises InvalidState
        for a manifest that cannot be parsed (never guess what a damaged checkpoint references)."""
        manifest = self.store.published(checkpoint_id)
        if manifest is None:
            return set()
        keys = {layout.global_manifest_key(checkpoint_id)}
        for participant in manifest.participants:
            keys.add(participant.manifest_key)
            try:
                parsed = self.store.read_participant_manifest(checkpoint_id, participant.manifest_key)
            except NotFound:
                continue  # already damaged: nothing more of it can be read
            if isinstance(parsed, PackedManifest):
                keys.update(p.key for p in parsed.packs)
            else:
                keys.update(
                    layout.v1_record_key(parsed.checkpoint_id, parsed.participant_id, r.key) for r in parsed.records
                )
        return keys

    def kept_for_others(self, checkpoint_id: str) -> dict[str, list[str]]:
        """Objects stored under ``checkpoint_id`` that other published checkpoints read: key -> their ids."""
        return self._kept_by_published(checkpoint_id)[0]

    def _kept_by_published(self, checkpoint_id: str) -> tuple[dict[str, list[str]], set[str]]:
        kept: dict[str, list[str]] = {}
        published: set[str] = set()
        for other in self.store.checkpoint_ids():
            if other == checkpoint_id:
                continue
            try:
                manifest = self.store.published(other)
            except InvalidState:
                raise InvalidState(
                    f"checkpoint {other}'s manifest is unreadable; cannot tell what it references"
                ) from None
            if manifest is None:
                continue  # unpublished: its reuse intents protect what it will read (kept_objects)
            published.add(other)
            if checkpoint_id in manifest.references:
                self._keep(kept, checkpoint_id, other, self.objects_read_by(other))
        return kept, published

    @staticmethod
    def _keep(kept: dict[str, list[str]], checkpoint_id: str, reader: str, keys: set[str] | list[str]) -> None:
        """Note every key of ``keys`` under ``checkpoint_id`` as read by ``reader``."""
        for key in keys:
            if layout.checkpoint_of(key) == checkpoint_id and reader not in kept.get(key, []):
                kept.setdefault(key, []).append(reader)

    def kept_objects(self, checkpoint_id: str, now: float | None = None) -> dict[str, list[str]]:
        """Objects stored under ``checkpoint_id`` that any other checkpoint reads or will read: key -> their ids.

        Published checkpoints first (their manifests), then those in flight (their reuse intents), each listed
        afresh: a checkpoint published or started meanwhile is seen by the second pass. Call it only after
        ``checkpoint_id``'s global manifest is gone (module docstring: the order is the guarantee).
        """
        kept, published = self._kept_by_published(checkpoint_id)
        for other in self.store.checkpoint_ids():
            if other == checkpoint_id or other in published:
                continue
            state = self.store.state(other)
            if state.published:  # published since the first pass
                self._keep(kept, checkpoint_id, other, self.objects_read_by(other))
            if state.published or state.in_flight(now):
                for intent in self.store.reuse_intents(other):
                    self._keep(kept, checkpoint_id, other, intent.packs)
        return kept

    # --- deletion -------------------------------------------------------------------------

    def objects(self, checkpoint_id: str) -> list[str]:
        """Every key stored under one checkpoint, in removal order (global manifest first, claim and tombstone
        last)."""
        keys = self._storage.list(check_key(layout.checkpoint_prefix(checkpoint_id)))
        return sorted(keys, key=lambda k: (layout.removal_order(checkpoint_id, k), k))

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
        state = self.store.state(checkpoint_id)
        if state.in_flight(now) and not abandoned:
            claim = state.claim
            assert claim is not None
            raise CheckpointInFlight(
                f"checkpoint {checkpoint_id} at {self.store.url} is being written (claimed "
                f"{time.ctime(claim.created_at)} by {claim.claimed_by}, not published): its transaction may still "
                f"publish it until {time.ctime(state.in_flight_until)}; delete it once that transaction has failed "
                "(`gymckpt status`), or after that time"
            )
        if state.tombstone is None:
            self.store.write_tombstone(
                checkpoint_id, "abandoned" if abandoned and not state.published else "deleted", by, now
            )
        removed = 0
        manifest_key = layout.global_manifest_key(checkpoint_id)
        if state.published:
            self._storage.delete(manifest_key)  # first: from here no restore and no new reuse finds it
            removed += 1
        kept = self.kept_objects(checkpoint_id, now)  # only after the manifest is gone (module docstring)
        markers = (layout.claim_key(checkpoint_id), layout.tombstone_key(checkpoint_id))
        for key in keys:
            if key in kept or key in markers or key == manifest_key:
                continue
            self._storage.delete(key)
            removed += 1
        if kept:
            return Deleted(checkpoint_id, removed, state.published, kept=len(kept) + len(markers))
        for key in markers:  # the tombstone last: a rerun still knows
            self._storage.delete(key)
            removed += key in keys  # the tombstone counts only when it was there before this call
        return Deleted(checkpoint_id=checkpoint_id, objects=removed, published=state.published)

    def prune(self, now: float | None = None) -> list[Deleted]:
        """Remove the leftovers of checkpoints that will never be published: failed, abandoned (unpublished and
        older than their bound to publish, or without a claim), or deleted with objects kept for others that
        nobody reads any more. Published and in-flight checkpoints are never touched."""
        now = time.time() if now is None else now
        out = []
        for checkpoint_id in self.store.checkpoint_ids():
            state = self.store.state(checkpoint_id)
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
