"""Deleting a checkpoint's stored objects: the one storage-side deletion the CLI and the operator share.

``gymckpt checkpoints delete`` (:mod:`gym_services.commands.stack`) and a deleted Checkpoint resource
whose ``deletionPolicy`` is ``Delete`` (``gym_operator.handlers``) both call :func:`delete_checkpoint`;
``gymckpt checkpoints prune`` calls :func:`prune` for the leftovers of checkpoints that never published.
Who may delete (no restore of the checkpoint running) is the caller's check; this module only removes
objects, in an order that never leaves a restorable checkpoint half deleted and never removes an object
another checkpoint reads or will read (``docs/protocol.md``, "Deleting checkpoints"):

1. a checkpoint still being written (:meth:`~gym_services.coordination.references.CheckpointState.in_flight`)
   is refused (:class:`InFlight`), unless its caller knows its transaction is over (``abandoned``);
2. a tombstone is written: the id is never published again, its claim refuses every transaction;
3. the global manifest goes (without it the checkpoint is unknown to every restore and to every
   participant choosing what to reuse);
4. then what others read is worked out (:func:`~gym_services.coordination.references.kept_objects`) and
   everything else goes, the participants' manifests first;
5. the claim and the tombstone go last, and only when nothing was kept: objects kept for others keep the
   id taken, so a new checkpoint under it can never overwrite them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gym_services.control import layout
from gym_services.control.models import SCHEMA_VERSION, StatusResponse, Tombstone
from gym_services.control.protocol import Phase
from gym_services.control.storage import Storage
from gym_services.control.storage.base import check_key
from gym_services.coordination.references import checkpoint_state, kept_objects


class InFlight(Exception):
    """The checkpoint is being written (claimed, not published, within its bound to publish): not deleted."""


@dataclass(frozen=True)
class Deleted:
    """What :func:`delete_checkpoint` removed."""

    checkpoint_id: str
    objects: int
    published: bool  # whether a global manifest was there (a complete checkpoint, not a failed one's leftovers)
    kept: int = 0  # objects left in place because other checkpoints read them (claim and tombstone included)


def _order(checkpoint_id: str, key: str) -> int:
    if key == layout.global_manifest_key(checkpoint_id):
        return 0
    if key.endswith("/manifest.json"):
        return 1
    if key in (layout.claim_key(checkpoint_id), layout.tombstone_key(checkpoint_id)):
        return 3
    return 2


def checkpoint_objects(storage: Storage, checkpoint_id: str) -> list[str]:
    """Every key stored under one checkpoint, in deletion order (global manifest first, claim and tombstone last)."""
    prefix = check_key(layout.checkpoint_prefix(checkpoint_id))
    keys = storage.list(prefix)
    return sorted(keys, key=lambda k: (_order(checkpoint_id, k), k))


def delete_checkpoint(
    storage: Storage, checkpoint_id: str, *, abandoned: bool = False, by: str = "", now: float | None = None
) -> Deleted:
    """Remove every object of ``checkpoint_id`` at ``storage`` that no other checkpoint reads (none there:
    0 objects, not an error).

    Raises :class:`InFlight` for a checkpoint still being written, unless ``abandoned``: the caller
    knows its transaction is over for good (a Checkpoint resource deleted after its transaction was
    cancelled). Idempotent: a deletion interrupted half-way is finished by running it again. Raises
    :class:`~gym_services.control.storage.StorageError` when storage refuses (the objects not yet
    removed stay, the manifest first among those already gone).
    """
    now = time.time() if now is None else now
    keys = checkpoint_objects(storage, checkpoint_id)
    if not keys:
        return Deleted(checkpoint_id=checkpoint_id, objects=0, published=False)
    state = checkpoint_state(storage, checkpoint_id)
    if state.in_flight(now) and not abandoned:
        claim = state.claim
        assert claim is not None
        raise InFlight(
            f"checkpoint {checkpoint_id} at {storage.url} is being written (claimed {time.ctime(claim.created_at)} by "
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
        storage.put(tombstone_key, tombstone.model_dump_json(indent=1).encode())
    removed = 0
    manifest_key = layout.global_manifest_key(checkpoint_id)
    if state.published:
        storage.delete(manifest_key)  # first: from here no restore and no new reuse finds it
        removed += 1
    kept = kept_objects(storage, checkpoint_id, now)  # only after the manifest is gone (references.py)
    markers = {layout.claim_key(checkpoint_id), tombstone_key}
    for key in keys:
        if key in kept or key in markers or key == manifest_key:
            continue
        storage.delete(key)
        removed += 1
    if kept:
        return Deleted(checkpoint_id, removed, state.published, kept=len(kept) + len(markers))
    for key in (layout.claim_key(checkpoint_id), tombstone_key):  # the tombstone last: a rerun still knows
        storage.delete(key)
        removed += key in keys  # the tombstone counts only when it was there before this call
    return Deleted(checkpoint_id=checkpoint_id, objects=removed, published=state.published)


def prune(storage: Storage, now: float | None = None) -> list[Deleted]:
    """Remove the leftovers of checkpoints that will never be published: abandoned (unpublished and
    older than their bound to publish, or without a claim), or deleted with objects kept for others
    that nobody reads any more. Published and in-flight checkpoints are never touched."""
    now = time.time() if now is None else now
    out = []
    for checkpoint_id in storage.list_folders("checkpoints"):
        state = checkpoint_state(storage, checkpoint_id)
        if state.published or state.in_flight(now):
            continue
        deleted = delete_checkpoint(storage, checkpoint_id, now=now)
        if deleted.objects:
            out.append(deleted)
    return out


def restoring(statuses: dict[str, object], checkpoint_id: str) -> list[str]:
    """Participants (by id) whose restore of ``checkpoint_id`` is still under way: a checkpoint they read
    is not deleted. ``statuses`` is :meth:`Coordinator.status`'s answer (errors are skipped)."""
    busy = (Phase.RESTORING, Phase.RESTORED)
    return sorted(
        pid
        for pid, status in statuses.items()
        if isinstance(status, StatusResponse) and status.checkpoint_id == checkpoint_id and status.phase in busy
    )
