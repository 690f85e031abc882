"""Catalog sync: the checkpoints stored at a location appear as Checkpoint resources (Velero's backup sync).

After a cluster is lost, the chart installed on a new one with the same storage location brings its checkpoints
back as resources, restorable by name (a Restore's ``checkpointRef``) without knowing their ids. When a location of
the release becomes Available the first time in an operator's leadership (:mod:`.location`), every published
checkpoint there that no Checkpoint of the namespace names (``status.checkpointId`` at that location), and that no
other release took (its stored claim, :func:`~.context.claimed_release`; one the CLI took has none), gets one:

- named after its checkpoint id (lower-cased, a short digest appended when the id is no valid name or the name is
  taken), annotated ``gym-checkpoint.dev/synced-from`` (the location) and ``gym-checkpoint.dev/checkpoint-id``,
  labelled ``gym-checkpoint.dev/synced=true``;
- ``spec``: the release, the location, ``deletionPolicy: Retain`` (deleting it keeps the data; it comes back at the
  next sync, as a Velero backup does; set ``deletionPolicy: Delete`` first to remove the data too);
- ``status``: Completed (reason ``Synced``), from the stored manifest: checkpoint id, location, participants,
  records, bytes, method, its publication time as ``completionTime``.

A synced Checkpoint runs no transaction (:mod:`.checkpoint` leaves it alone); one created but never given its
status (the operator stopped in between) gets it at the next sync.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import re
from typing import Any

from gym_operator.controllers import backups
from gym_operator.controllers.context import Context, claimed_release
from gym_operator.controllers.location import storage_config
from gym_operator.kube import KubeError, Unavailable
from gym_operator.metrics import METRICS
from gym_operator.specs import StorageLocation
from gym_operator.status import condition
from gym_services.control.models import GlobalManifest
from gym_services.control.participant import InvalidState
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.store import CheckpointStore

log = logging.getLogger("gym.operator")

SYNCED_FROM = "gym-checkpoint.dev/synced-from"
CHECKPOINT_ID = "gym-checkpoint.dev/checkpoint-id"
SYNCED_LABEL = "gym-checkpoint.dev/synced"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,240}[a-z0-9])?$")


def synced(body: Any) -> bool:
    """Whether a Checkpoint was made by the catalog sync (it runs no transaction)."""
    return bool(((body.get("metadata") or {}).get("annotations") or {}).get(SYNCED_FROM))


def resource_name(checkpoint_id: str, taken: set[str]) -> str:
    """A Checkpoint name for a stored checkpoint id: the id itself when it is a valid, free name."""
    name = checkpoint_id.lower()
    if name == checkpoint_id and _NAME.match(name) and name not in taken:
        return name
    base = re.sub(r"[^a-z0-9.-]+", "-", name).strip("-.")[:200] or "checkpoint"
    return f"{base}-{hashlib.sha256(checkpoint_id.encode()).hexdigest()[:8]}"


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def synced_status(manifest: GlobalManifest, location: StorageLocation, generation: int | None) -> dict[str, Any]:
    """A synced Checkpoint's status, from its stored manifest."""
    message = (
        f"synced from storage location {location.name}: checkpoint {manifest.checkpoint_id}, published "
        f"{_stamp(manifest.created_at)}"
    )
    participants = []
    for p in manifest.participants:
        entry: dict[str, Any] = {"id": p.participant_id, "role": p.role.value, "records": p.records, "bytes": p.bytes}
        if p.replica is not None:
            entry["replica"] = p.replica.model_dump(mode="json")
        participants.append(entry)
    return {
        "phase": "Completed",
        "reason": "Synced",
        "message": message,
        "checkpointId": manifest.checkpoint_id,
        "location": location.url,
        "participants": participants,
        "participantCount": len(participants),
        "records": sum(p.records for p in manifest.participants),
        "bytes": manifest.bytes or sum(p.bytes for p in manifest.participants),
        "method": manifest.method.value,
        "episodes": len(manifest.episodes or []),
        "completionTime": _stamp(manifest.created_at),
        "observedGeneration": generation,
        "conditions": [
            condition("Progressing", False, "Synced", message, generation),
            condition("Completed", True, "Synced", message, generation),
            condition("Failed", False, "Synced", message, generation),
        ],
    }


async def sync(location: StorageLocation, resource: dict[str, Any], namespace: str, context: Context) -> list[str]:
    """Give every published checkpoint at ``location`` a Checkpoint (module docstring); the names created."""
    kube = context.kube
    try:
        config = await storage_config(location, namespace, context)
        store = CheckpointStore(open_storage(location.url, config))
        stored = await asyncio.to_thread(store.checkpoints)
        existing = await kube.list_objects("checkpoints", namespace)
    except (StorageError, InvalidState, LookupError, KubeError) as exc:
        log.warning(f"catalog sync of storage location {location.name} failed: {exc}")
        return []
    known: dict[str, dict[str, Any]] = {}
    for obj in existing:
        status, meta = obj.get("status") or {}, obj.get("metadata") or {}
        if status.get("checkpointId") and status.get("location") == location.url:
            known[status["checkpointId"]] = obj
        elif (meta.get("annotations") or {}).get(SYNCED_FROM) == location.name:
            known[meta["annotations"].get(CHECKPOINT_ID, "")] = obj
    taken = {obj["metadata"]["name"] for obj in existing}
    created: list[str] = []
    for checkpoint_id, manifest in stored:
        if manifest is None:
            continue  # unpublished: in flight, failed, or being deleted
        found = known.get(checkpoint_id)
        if found is not None:
            if synced(found) and not (found.get("status") or {}).get("phase"):
                await _write_status(found, manifest, location, namespace, context)  # made, never given its status
            continue
        if not await _ours_to_show(store, checkpoint_id, context):
            continue
        name = resource_name(checkpoint_id, taken)
        taken.add(name)
        made = await _create(name, checkpoint_id, location, namespace, context)
        if made is not None:
            await _write_status(made, manifest, location, namespace, context)
            created.append(name)
    if created:
        message = f"synced {len(created)} stored checkpoint(s) as Checkpoint resources: {', '.join(created)}"
        log.info(f"storage location {location.name}: {message}")
        try:
            await kube.event(resource, "CatalogSynced", message)
        except KubeError as exc:
            log.warning(f"could not post the CatalogSynced Event: {exc}")
    return created


async def _ours_to_show(store: CheckpointStore, checkpoint_id: str, context: Context) -> bool:
    """Whether this release's catalog shows a stored checkpoint: unless its claim names another release (two releases
    sharing a location each sync their own; a Checkpoint of this release for another's checkpoint would let a Restore
    of this release restore the other's rollouts). One taken outside any release (the CLI) is shown."""
    try:
        state = await asyncio.to_thread(store.state, checkpoint_id)
    except (StorageError, InvalidState) as exc:
        log.warning(f"catalog sync: checkpoint {checkpoint_id} skipped, its claim is unreadable ({exc})")
        return False
    taken_by = claimed_release(state.claim.claimed_by) if state.claim is not None else None
    return taken_by is None or taken_by == context.settings.release


async def _create(
    name: str, checkpoint_id: str, location: StorageLocation, namespace: str, context: Context
) -> dict[str, Any] | None:
    body = {
        "apiVersion": "gym-checkpoint.dev/v1alpha1",
        "kind": "Checkpoint",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {SYNCED_LABEL: "true", backups.EXCLUDE: "true"},
            "annotations": {SYNCED_FROM: location.name, CHECKPOINT_ID: checkpoint_id},
        },
        "spec": {
            "release": context.settings.release,
            "storageLocation": location.resource or location.name,
            "deletionPolicy": "Retain",
        },
    }
    try:
        return await context.kube.create_object("checkpoints", namespace, body)
    except Unavailable as exc:
        log.warning(f"catalog sync: Checkpoint {name} for checkpoint {checkpoint_id} not created ({exc})")
    except KubeError as exc:
        log.warning(f"catalog sync: Checkpoint {name} for checkpoint {checkpoint_id} refused ({exc})")
    return None


async def _write_status(
    obj: dict[str, Any], manifest: GlobalManifest, location: StorageLocation, namespace: str, context: Context
) -> None:
    meta = obj.get("metadata") or {}
    status = synced_status(manifest, location, meta.get("generation"))
    try:
        await context.kube.patch_status("checkpoints", namespace, meta["name"], status)
    except KubeError as exc:
        log.warning(f"catalog sync: the status of Checkpoint {meta.get('name')} is not written yet ({exc})")
        return
    METRICS.succeeded(context.settings.release, manifest.created_at)  # the alert's clock: the newest stored one
