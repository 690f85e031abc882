"""Deleting a checkpoint's stored objects: the one storage-side deletion the CLI and the operator share.

``gymckpt checkpoints delete`` (:mod:`gym_services.commands.stack`) and a deleted Checkpoint resource
whose ``deletionPolicy`` is ``Delete`` (``gym_operator.handlers``) both call :func:`delete_checkpoint`.
Who may delete (no restore of the checkpoint running) is the caller's check; this module only removes
objects, in an order that never leaves a restorable checkpoint half deleted: the global manifest goes
first (without it the checkpoint is unknown to every restore, ``docs/protocol.md``, "Records and
manifests"), then the participants' manifests, then records and restore decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from gym_services.control import layout
from gym_services.control.models import StatusResponse
from gym_services.control.protocol import Phase
from gym_services.control.storage import Storage
from gym_services.control.storage.base import check_key
from gym_services.coordination.references import kept_for_others


@dataclass(frozen=True)
class Deleted:
    """What :func:`delete_checkpoint` removed."""

    checkpoint_id: str
    objects: int
    published: bool  # whether a global manifest was there (a complete checkpoint, not a failed one's leftovers)


def _order(checkpoint_id: str, key: str) -> int:
    if key == layout.global_manifest_key(checkpoint_id):
        return 0
    if key.endswith("/manifest.json"):
        return 1
    return 2


def checkpoint_objects(storage: Storage, checkpoint_id: str) -> list[str]:
    """Every key stored under one checkpoint, in deletion order (global manifest first)."""
    prefix = check_key(layout.checkpoint_prefix(checkpoint_id))
    keys = storage.list(prefix)
    return sorted(keys, key=lambda k: (_order(checkpoint_id, k), k))


def delete_checkpoint(storage: Storage, checkpoint_id: str) -> Deleted:
    """Remove every object of ``checkpoint_id`` at ``storage`` (none there: 0 objects, not an error).

    Idempotent: a deletion interrupted half-way is finished by running it again. Raises
    :class:`~gym_services.control.storage.StorageError` when storage refuses (the objects not yet
    removed stay, the manifest first among those already gone).
    """
    keys = checkpoint_objects(storage, checkpoint_id)
    published = bool(keys) and keys[0] == layout.global_manifest_key(checkpoint_id)
    kept = kept_for_others(storage, checkpoint_id)  # packs a later incremental checkpoint still reads stay
    keys = [k for k in keys if k not in kept]
    for key in keys:
        storage.delete(key)
    return Deleted(checkpoint_id=checkpoint_id, objects=len(keys), published=published)


def restoring(statuses: dict[str, object], checkpoint_id: str) -> list[str]:
    """Participants (by id) whose restore of ``checkpoint_id`` is still under way: a checkpoint they read
    is not deleted. ``statuses`` is :meth:`Coordinator.status`'s answer (errors are skipped)."""
    busy = (Phase.RESTORING, Phase.RESTORED)
    return sorted(
        pid
        for pid, status in statuses.items()
        if isinstance(status, StatusResponse) and status.checkpoint_id == checkpoint_id and status.phase in busy
    )
