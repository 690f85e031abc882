"""A Checkpoint's end: its expiry (``spec.ttl``) and its deletion (``spec.deletionPolicy``), as Velero's.

- Expiry: once a Checkpoint's transaction has ended, ``status.expiration`` is its creation plus ``spec.ttl`` (kept up
  to date when the ttl changes); once it passes, the operator deletes the Checkpoint.
- Deletion: a deleted Checkpoint's transaction is cancelled first (its daemon aborts it; with no daemon of this
  operator running it, its id is aborted on every participant). With ``deletionPolicy: Delete`` its stored objects
  are then removed (:class:`gym_services.control.retention.Retention`), never while a Restore reads them. Storage
  that keeps failing is tried ``GYMCKPT_DELETE_ATTEMPTS`` times (delays doubling), then the data is kept: one
  ``DataKept`` Warning and the ``DataDeleted=False`` condition say so, and the Checkpoint goes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
from typing import Any

import kopf

from gym_operator.controllers.context import FINAL, Context, discover, storage_access
from gym_operator.discovery import DiscoveryError
from gym_operator.kube import KubeError
from gym_operator.specs import CheckpointSpec, DeletionPolicy, SelectorSpec, SpecError, UnknownLocation
from gym_operator.status import condition
from gym_operator.writer import StatusWriter
from gym_services.control.participant import InvalidState
from gym_services.control.retention import Retention
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator

log = logging.getLogger("gym.operator")

#: seconds a deleted Checkpoint's cleanup waits at once for its cancelled transaction (then it is retried)
CANCEL_PATIENCE_S = 60.0
#: how often a Checkpoint waiting for its expiration re-reads its spec (kopf keeps the body live: no API call)
EXPIRY_POLL_S = 1.0


# --- expiry ------------------------------------------------------------------------------------------------------


def expiration(body: kopf.Body) -> dt.datetime | None:
    """When the Checkpoint expires: its creation plus ``spec.ttl`` (read from the live body: ttl may change)."""
    try:
        ttl = CheckpointSpec.parse(body.get("spec")).ttl
    except SpecError:
        return None
    created = (body.get("metadata") or {}).get("creationTimestamp")
    if ttl is None or not created:
        return None
    return dt.datetime.fromisoformat(created.replace("Z", "+00:00")) + ttl


async def expire(stopped: kopf.DaemonStopped, body: kopf.Body, context: Context) -> None:
    """The expiry daemon of one Checkpoint: once its transaction has ended, keep ``status.expiration`` up to date
    with ``spec.ttl``; once it passes, delete the Checkpoint (its ``deletionPolicy`` then decides what happens to
    the stored objects). A Checkpoint whose spec is invalid never expires (its transaction failed; nothing of it
    is stored)."""
    try:
        CheckpointSpec.parse(body.get("spec"))
    except SpecError:
        return
    meta = body.get("metadata") or {}
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    while not stopped.is_set() and (body.get("status") or {}).get("phase") not in FINAL:
        await stopped.wait(EXPIRY_POLL_S)  # the transaction's daemon writes the final phase
    written = (body.get("status") or {}).get("expiration")
    while not stopped.is_set():
        when = expiration(body)
        stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else None
        if stamp != written:
            generation = (body.get("metadata") or {}).get("generation")
            writer = StatusWriter(context.kube, "checkpoints", namespace, name, generation, None)
            writer.write({"expiration": stamp})
            await writer.flush(timeout_s=30.0)
            await writer.close()
            written = stamp
        if when is None:
            await stopped.wait(EXPIRY_POLL_S)
            continue
        left = (when - dt.datetime.now(dt.UTC)).total_seconds()
        if left > 0:
            await stopped.wait(min(left, EXPIRY_POLL_S))
            continue
        kopf.info(body, reason="Expired", message=f"spec.ttl ran out at {stamp}: deleting the Checkpoint")
        try:
            await context.kube.delete_object("checkpoints", namespace, name, uid)
        except KubeError as exc:
            log.warning(f"Checkpoint {name}: expired, but deleting it failed ({exc}); retrying")
            await stopped.wait(5.0)
            continue
        await stopped.wait()  # the deletion stops this daemon


# --- deletion ----------------------------------------------------------------------------------------------------


async def checkpoint_deleted(body: kopf.Body, retry: int, context: Context) -> None:
    """A deleted Checkpoint: its transaction is cancelled first (the daemon aborts it); then, with
    ``deletionPolicy: Delete``, its stored objects are removed once no Restore reads them. Raises
    :class:`kopf.TemporaryError` while it must wait (kopf calls it again, ``retry`` counting)."""
    meta = body.get("metadata") or {}
    namespace, uid = meta["namespace"], meta["uid"]
    context.namespaces.add(namespace)
    running = context.running.get(uid)
    if running is not None and not running.is_set():
        try:  # the daemon was told (kopf stops daemons first): it aborts, writes the outcome, and ends
            await asyncio.wait_for(running.wait(), timeout=CANCEL_PATIENCE_S)
        except TimeoutError:
            raise kopf.TemporaryError("waiting for its transaction to be cancelled", delay=1) from None
    status = dict(body.get("status") or {})
    checkpoint_id = status.get("checkpointId")
    try:
        spec = CheckpointSpec.parse(body.get("spec"))
    except SpecError:
        return  # nothing the operator wrote can be found from an invalid spec
    if status.get("phase") not in FINAL and running is None and checkpoint_id:
        await _abort_orphan(spec.selector, namespace, checkpoint_id, context)
    if spec.deletion_policy is DeletionPolicy.RETAIN or not checkpoint_id or not status.get("location"):
        return
    readers = [
        r["metadata"]["name"]
        for r in await context.kube.list_objects("restores", namespace)
        if restore_reads(r, meta["name"], checkpoint_id, spec.storage_location)
    ]
    if readers:
        message = f"not deleting checkpoint {checkpoint_id} while Restore {', '.join(sorted(readers))} reads it"
        context.event_once(body, "WaitingForRestore", message)
        raise kopf.TemporaryError(message, delay=2)
    await _delete_stored(body, spec, status, retry, context)


def restore_reads(restore: dict[str, Any], name: str, checkpoint_id: str | None, location: str) -> bool:
    """Whether a Restore that has not ended reads this Checkpoint (by name, or by id and storage location)."""
    if (restore.get("status") or {}).get("phase") in FINAL:
        return False
    spec = restore.get("spec") or {}
    if (spec.get("checkpointRef") or {}).get("name") == name:
        return True
    return (
        bool(checkpoint_id)
        and spec.get("checkpointId") == checkpoint_id
        and spec.get("storageLocation", "default") == location
    )


async def _abort_orphan(selector: SelectorSpec, namespace: str, checkpoint_id: str, context: Context) -> None:
    """A Checkpoint deleted mid-transaction while no daemon of this operator ran it (the operator was down):
    abort its id on every participant, so none waits for its pause lease."""
    try:
        participants = await discover(namespace, selector, context)
    except (DiscoveryError, KubeError):
        return
    async with ControlClient(context.settings.token, timeout_s=10.0) as client:
        await Coordinator(participants, client).abort_all(checkpoint_id, participants)


async def _delete_stored(
    body: kopf.Body, spec: CheckpointSpec, status: dict[str, Any], retry: int, context: Context
) -> None:
    """Remove a deleted Checkpoint's stored objects; a failure is retried (kopf, delays doubling) until the
    operator's tries are spent, then the data is kept and the Checkpoint goes."""
    meta = body.get("metadata") or {}
    checkpoint_id, stored_at = status["checkpointId"], status["location"]
    try:
        storage = context.settings.location(spec.storage_location)
    except UnknownLocation as exc:
        message = f"not deleting checkpoint {checkpoint_id} at {stored_at}: {exc}"
        kopf.warn(body, reason="DataKept", message=message[:1024])
        return  # the admin removed the location: nothing this operator can reach, and nothing to wait for
    try:
        config, _access = await storage_access(storage, meta["namespace"], context.kube, context.settings)
        # the transaction is over (cancelled above, or its operator gone): never published later, so an
        # unpublished checkpoint of it is abandoned, not in flight
        retention = Retention(CheckpointStore(open_storage(stored_at, config)))
        by = f"Checkpoint {meta['namespace']}/{meta['name']}"
        deleted = await asyncio.to_thread(functools.partial(retention.delete, checkpoint_id, abandoned=True, by=by))
    except (StorageError, LookupError, InvalidState) as exc:
        await _delete_failed(body, status, retry, context, f"{exc}")
        return
    message = f"deleted checkpoint {checkpoint_id} at {stored_at}: {deleted.objects} objects"
    kopf.info(body, reason="DataDeleted", message=message)


async def _delete_failed(body: kopf.Body, status: dict[str, Any], retry: int, context: Context, error: str) -> None:
    """One failed try to delete the stored objects: retried later (:class:`kopf.TemporaryError`) or, the tries
    spent, given up: the data is kept (storage gone for good must not hold the Checkpoint, its namespace and its
    CRD for ever)."""
    checkpoint_id, stored_at = status["checkpointId"], status["location"]
    tries = context.settings.delete_tries
    if retry + 1 >= tries:
        message = (
            f"deleting checkpoint {checkpoint_id} at {stored_at} failed {tries} times ({error}); the data is "
            f"kept and the Checkpoint goes: remove it with `gymckpt checkpoints delete {checkpoint_id} --storage "
            f"{stored_at}` once the storage answers"
        )
        await _data_condition(body, status, "DataKept", message, context)
        kopf.warn(body, reason="DataKept", message=message[:1024])
        return
    message = (
        f"deleting checkpoint {checkpoint_id} at {stored_at} failed (try {retry + 1} of {tries}): {error}; "
        "retrying (set spec.deletionPolicy: Retain to keep it)"
    )
    if retry == 0:
        await _data_condition(body, status, "DeleteFailed", message, context)
    context.event_once(
        body,
        "DeleteFailed",
        f"deleting checkpoint {checkpoint_id} at {stored_at} failed: {error}; trying {tries} times in all "
        "(set spec.deletionPolicy: Retain to keep it)",
        warning=True,
    )
    # doubling from GYMCKPT_DELETE_RETRY_SECONDS (10 s: 10, 20, 40, ... at most 10 min apart), then given up
    raise kopf.TemporaryError(message, delay=min(context.settings.delete_retry_s * 2 ** min(retry, 6), 600))


async def _data_condition(body: kopf.Body, status: dict[str, Any], reason: str, message: str, context: Context) -> None:
    """The ``DataDeleted=False`` condition of a deleted Checkpoint whose data could not be deleted (best effort)."""
    meta = body.get("metadata") or {}
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "DataDeleted"]
    conditions.append(condition("DataDeleted", False, reason, message, meta.get("generation")))
    try:
        await context.kube.patch_status("checkpoints", meta["namespace"], meta["name"], {"conditions": conditions})
    except KubeError as exc:
        log.warning(f"Checkpoint {meta['name']}: could not write the DataDeleted condition ({exc})")
