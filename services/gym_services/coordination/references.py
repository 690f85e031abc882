"""Which stored objects a checkpoint reads, and which of a checkpoint's objects others still read.

An incremental checkpoint (the ``snapshot`` method) references records in packs of earlier checkpoints
instead of writing them again; its global manifest lists those checkpoints in ``references``
(``docs/protocol.md``, "Records and manifests"). Whoever deletes a checkpoint's objects (retention,
``gymckpt checkpoints delete``, the operator) must keep every object another published checkpoint reads:
:func:`kept_for_others` says which. Removing the deleted checkpoint's global manifest is always safe
(no restore reads another checkpoint's manifests).
"""

from __future__ import annotations

from gym_services.control import layout
from gym_services.control.models import PackedManifest
from gym_services.control.participant import InvalidState
from gym_services.control.records import parse_participant_manifest
from gym_services.control.storage import NotFound, Storage
from gym_services.coordination.coordinator import parse_global_manifest


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
    prefix = layout.checkpoint_prefix(checkpoint_id) + "/"
    kept: dict[str, list[str]] = {}
    for other in storage.list_folders("checkpoints"):
        if other == checkpoint_id:
            continue
        try:
            manifest = parse_global_manifest(storage.get(layout.global_manifest_key(other)))
        except NotFound:
            continue  # unpublished: it never becomes restorable, it protects nothing
        except InvalidState:
            raise InvalidState(f"checkpoint {other}'s manifest is unreadable; cannot tell what it references") from None
        if checkpoint_id not in manifest.references:
            continue
        for key in objects_read_by(storage, other):
            if key.startswith(prefix):
                kept.setdefault(key, []).append(other)
    return kept
