"""A Checkpoint's deletion (``spec.deletionPolicy``), as Velero's (its expiry, ``spec.ttl``, is :mod:`.expiry`'s).

- Finalizer: only a Checkpoint whose deletion needs the operator holds its finalizer (:func:`needs_operator`).
- Deletion: a deleted Checkpoint's transaction is cancelled first (its daemon aborts it; with no daemon of this
  operator running it, its id is aborted on every participant). With ``deletionPolicy: Delete`` its stored objects
  are then removed (:class:`gym_services.control.retention.Retention`), never while a Restore reads them. Storage
  that keeps failing is tried ``GYMCKPT_DELETE_ATTEMPTS`` times (delays doubling), then the data is kept: one
  ``DataKept`` Warning and the ``DataDeleted=False`` condition say so, and the Checkpoint goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

import kopf

from gym_operator.controllers.context import FINAL, Context, Refused, discover
from gym_operator.controllers.location import resolve, storage_config
from gym_operator.discovery import DiscoveryError
from gym_operator.kube import KubeError
from gym_operator.specs import CheckpointSpec, DeletionPolicy, SelectorSpec, SpecError
from gym_operator.status import condition
from gym_services.control.participant import InvalidState
from gym_services.control.retention import Retention
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator

log = logging.getLogger("gym.operator")

#: seconds a deleted Checkpoint's cleanup waits at once for its cancelled transaction (then it is retried)
CANCEL_PATIENCE_S = 60.0


def needs_operator(spec: Any, status: Any) -> bool:
    """Whether deleting a Checkpoint needs its operator (so it holds the operator's finalizer): its transaction has
    not ended (the deletion cancels it), or ``deletionPolicy: Delete`` with stored objects to remove. A Checkpoint at
    rest with ``Retain`` (the default) needs nothing: its deletion never waits for an operator."""
    status = status or {}
    if status.get("phase") not in FINAL:
        return True
    return (
        (spec or {}).get("deletionPolicy") == DeletionPolicy.DELETE
        and bool(status.get("checkpointId"))
        and bool(status.get("location"))
    )


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
    if await _namespace_terminating(namespace, context):
        message = (
            f"namespace {namespace} is being deleted: the Checkpoint goes without deleting checkpoint {checkpoint_id} "
            f"at {status['location']} (`gymckpt checkpoints delete {checkpoint_id} --storage {status['location']}` "
            "removes it)"
        )
        context.event_once(body, "DataKept", message, warning=True)
        return  # as when the release goes away: its deletion must not wait for storage
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


async def _namespace_terminating(namespace: str, context: Context) -> bool:
    try:
        return await context.kube.deletion_started("namespace", namespace, namespace)
    except KubeError as exc:
        log.warning(f"cannot tell whether namespace {namespace} is being deleted ({exc}); deleting the data as asked")
        return False


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
    async with ControlClient(context.settings.token, timeout_s=10.0, fence=context.fence) as client:
        await Coordinator(participants, client).abort_all(checkpoint_id, participants)


async def _delete_stored(
    body: kopf.Body, spec: CheckpointSpec, status: dict[str, Any], retry: int, context: Context
) -> None:
    """Remove a deleted Checkpoint's stored objects; a failure is retried (kopf, delays doubling) until the
    operator's tries are spent, then the data is kept and the Checkpoint goes."""
    meta = body.get("metadata") or {}
    checkpoint_id, stored_at = status["checkpointId"], status["location"]
    try:
        storage = await resolve(spec.storage_location, meta["namespace"], context)
    except Refused as exc:
        message = f"not deleting checkpoint {checkpoint_id} at {stored_at}: {exc.message}"
        kopf.warn(body, reason="DataKept", message=message[:1024])
        return  # the admin removed the location: nothing this operator can reach, and nothing to wait for
    if storage.read_only:
        message = (
            f"not deleting checkpoint {checkpoint_id} at {stored_at}: storage location {storage.name} is ReadOnly "
            "(restored from, never written); the data is kept"
        )
        kopf.warn(body, reason="DataKept", message=message[:1024])
        return
    try:
        config = await storage_config(storage, meta["namespace"], context)
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
    version = meta.get("resourceVersion")
    for attempt in range(2):  # conditional on the version seen; once more over the current one after a conflict
        try:
            context.fence()
            await context.kube.patch_status(
                "checkpoints", meta["namespace"], meta["name"], {"conditions": conditions}, version
            )
            return
        except KubeError as exc:
            if exc.status == 409 and attempt == 0:
                with contextlib.suppress(KubeError):
                    current = await context.kube.get_object("checkpoints", meta["namespace"], meta["name"])
                    version = ((current or {}).get("metadata") or {}).get("resourceVersion")
                continue
            log.warning(f"Checkpoint {meta['name']}: could not write the DataDeleted condition ({exc})")
            return
