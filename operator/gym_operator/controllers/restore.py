"""A Restore's transaction: the coordinator's restore of a checkpoint into the stack its selector picks.

A Restore names its checkpoint by Checkpoint (``checkpointRef``: completed, of the same release, at a storage
location that still holds it) or by id and storage location (``checkpointId``, ``storageLocation``: a checkpoint
of the same release too, as a Checkpoint resource that recorded the id or its stored claim says; one taken outside
any release, by the CLI, may be restored into any). The resource's uid names the restore: an operator restarted
mid-restore repeats the same one. An automatic Restore (:mod:`.resume`) that completes gets a ``Resumed`` Event
naming its checkpoint.
"""

from __future__ import annotations

import asyncio

import kopf

from gym_operator.controllers import resume
from gym_operator.controllers.context import Context, Refused, Wait, claimed_release
from gym_operator.controllers.location import resolve, storage_config, usable
from gym_operator.controllers.transaction import Transaction, invalid, parse, run_once
from gym_operator.specs import DEFAULT_LOCATION, CheckpointSpec, RestoreSpec, SelectorSpec, SpecError, StorageLocation
from gym_services.control.participant import InvalidState
from gym_services.control.storage import open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import TransactionPhase, TransactionResult

#: what setup finds: the checkpoint id, the storage location, where the decision goes (None: there), the participants
Prepared = tuple[str, StorageLocation, StorageLocation | None, list[ParticipantRef]]


async def run(stopped: kopf.DaemonStopped, body: kopf.Body, context: Context) -> None:
    """The daemon of one Restore: its transaction, once (a final one is not run again)."""
    spec, why = parse(RestoreSpec, body.get("spec"))
    tx: Transaction[Prepared] = Transaction(
        "Restore", "restores", spec.selector if spec else SelectorSpec(), context, body
    )

    async def setup() -> Prepared:
        assert spec is not None
        checkpoint_id, storage = await source(spec, tx.namespace, context)
        await usable(storage, False, tx.namespace, context)
        decisions = await decision_location(storage, tx.namespace, context)
        return checkpoint_id, storage, decisions, await tx.participants()

    async def work(prepared: Prepared, cancel: asyncio.Event) -> TransactionResult:
        assert spec is not None
        checkpoint_id, storage, decisions, participants = prepared
        tx.fields.update(checkpointId=checkpoint_id, location=storage.url)
        async with ControlClient(
            context.settings.token, timeout_s=context.settings.restore_call_timeout_s, fence=context.fence
        ) as client:
            coordinator = await tx.coordinator(participants, storage, client, decisions)
            return await coordinator.restore(
                checkpoint_id,
                storage.url,
                lease_s=spec.lease_seconds,
                restore_id=tx.uid,
                cancel=cancel,
                decisions=await tx.decision_store(decisions),
            )

    ended_before = tx.final  # (an operator restarted after it ended: said already)
    await run_once(tx, stopped, setup if spec else invalid(why), work)
    labels = (body.get("metadata") or {}).get("labels") or {}
    status = tx.writer.status
    automatic = labels.get(resume.CREATED_BY_LABEL) == resume.AUTO_RESTORE
    if automatic and not ended_before and status.get("phase") == TransactionPhase.COMPLETED:
        checkpoint = ((body.get("spec") or {}).get("checkpointRef") or {}).get("name")
        message = (
            f"resumed automatically from checkpoint {status.get('checkpointId')} (Checkpoint {checkpoint}): "
            f"{status.get('restoredEpisodes', 0)} episodes continue as attempt {status.get('attempt', 0)}"
        )
        context.event_once(body, "Resumed", message)


async def source(spec: RestoreSpec, namespace: str, context: Context) -> tuple[str, StorageLocation]:
    """The checkpoint id and storage location a Restore names (directly, or by Checkpoint)."""
    if spec.checkpoint_ref is None:
        if not spec.checkpoint_id:
            raise Refused("InvalidSpec", "set checkpointRef.name, or checkpointId (with storageLocation)")
        storage = await resolve(spec.storage_location, namespace, context)
        taken_by = await release_of(spec.checkpoint_id, storage, namespace, context)
        if taken_by is not None and taken_by != spec.release:
            raise Refused(
                "CheckpointOfAnotherRelease",
                f"checkpoint {spec.checkpoint_id} at {storage.url} was taken by release {taken_by}, not "
                f"{spec.release}; restore a checkpoint of this release",
            )
        return spec.checkpoint_id, storage
    ref = spec.checkpoint_ref.name
    found = await context.kube.get_object("checkpoints", namespace, ref)
    if found is None:
        raise Refused("CheckpointNotFound", f"Checkpoint {ref} does not exist in {namespace}")
    if (found.get("metadata") or {}).get("deletionTimestamp"):
        raise Refused("CheckpointDeleted", f"Checkpoint {ref} is being deleted; nothing to restore")
    status = found.get("status") or {}
    release = (found.get("spec") or {}).get("release")
    if release != spec.release:
        raise Refused(
            "CheckpointOfAnotherRelease",
            f"Checkpoint {ref} belongs to release {release}, not {spec.release}; restore a Checkpoint of this release",
        )
    if status.get("phase") == TransactionPhase.FAILED:
        raise Refused("CheckpointFailed", f"Checkpoint {ref} failed; nothing to restore")
    if status.get("phase") != TransactionPhase.COMPLETED:
        raise Wait("WaitingForCheckpoint", f"waiting: Checkpoint {ref} is not completed yet")
    try:
        checkpointed = CheckpointSpec.parse(found.get("spec"))
    except SpecError as exc:
        raise Refused("InvalidSpec", f"Checkpoint {ref}: {exc}") from None
    storage = await resolve(checkpointed.storage_location, namespace, context)
    if status.get("location") != storage.url:
        raise Refused(
            "StorageLocationChanged",
            f"Checkpoint {ref} was written to {status.get('location')}, but storage location {storage.name} is now "
            f"{storage.url}; restore it by checkpointId from a location that holds it",
        )
    return str(status["checkpointId"]), storage


async def release_of(checkpoint_id: str, storage: StorageLocation, namespace: str, context: Context) -> str | None:
    """The release that took ``checkpoint_id``: a Checkpoint resource of the namespace that recorded it, else its
    stored claim (:func:`~.context.claimed_release`); None when neither says (taken by the CLI, or not there)."""
    for found in await context.kube.list_objects("checkpoints", namespace):
        if (found.get("status") or {}).get("checkpointId") == checkpoint_id:
            return str((found.get("spec") or {}).get("release"))
    try:
        config = await storage_config(storage, namespace, context)
    except LookupError as exc:
        raise Refused("CredentialsNotFound", str(exc)) from None
    store = CheckpointStore(open_storage(storage.url, config))
    try:
        state = await asyncio.to_thread(store.state, checkpoint_id)
    except InvalidState:
        return None  # (a malformed claim: the restore itself says what is wrong)
    return claimed_release(state.claim.claimed_by) if state.claim is not None else None


async def decision_location(storage: StorageLocation, namespace: str, context: Context) -> StorageLocation | None:
    """Where a restore's decision object goes: at the checkpoint's location, unless it is ReadOnly (restored from,
    never written); then at the release's ``default`` location, which must be ReadWrite."""
    if not storage.read_only:
        return None
    default = await resolve(DEFAULT_LOCATION, namespace, context)
    if default.read_only or default.url == storage.url:
        raise Refused(
            "NoWritableLocation",
            f"a restore from ReadOnly storage location {storage.name} writes its one decision object to the "
            f"release's default location, and {default.name} is ReadOnly too; give the release a ReadWrite default "
            "location",
        )
    await usable(default, True, namespace, context)
    return default
