"""A Restore's transaction: the coordinator's restore of a checkpoint into the stack its selector picks.

A Restore names its checkpoint by Checkpoint (``checkpointRef``: completed, of the same release, at a storage
location that still holds it) or by id and storage location (``checkpointId``, ``storageLocation``). The
resource's uid names the restore: an operator restarted mid-restore repeats the same one. An automatic Restore
(:mod:`.resume`) that completes gets a ``Resumed`` Event naming its checkpoint.
"""

from __future__ import annotations

import asyncio

import kopf

from gym_operator.controllers import resume
from gym_operator.controllers.context import Context, Refused, Wait, location
from gym_operator.controllers.transaction import Transaction, invalid, parse, run_once
from gym_operator.specs import CheckpointSpec, RestoreSpec, SelectorSpec, SpecError, StorageLocation
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import TransactionPhase, TransactionResult

#: what setup finds: the checkpoint id, the storage location, the participants
Prepared = tuple[str, StorageLocation, list[ParticipantRef]]


async def run(stopped: kopf.DaemonStopped, body: kopf.Body, context: Context) -> None:
    """The daemon of one Restore: its transaction, once (a final one is not run again)."""
    spec, why = parse(RestoreSpec, body.get("spec"))
    tx: Transaction[Prepared] = Transaction(
        "Restore", "restores", spec.selector if spec else SelectorSpec(), context, body
    )

    async def setup() -> Prepared:
        assert spec is not None
        checkpoint_id, storage = await source(spec, tx.namespace, context)
        return checkpoint_id, storage, await tx.participants()

    async def work(prepared: Prepared, cancel: asyncio.Event) -> TransactionResult:
        assert spec is not None
        checkpoint_id, storage, participants = prepared
        tx.fields.update(checkpointId=checkpoint_id, location=storage.url)
        async with ControlClient(context.settings.token, timeout_s=context.settings.restore_call_timeout_s) as client:
            coordinator = await tx.coordinator(participants, storage, client)
            return await coordinator.restore(
                checkpoint_id, storage.url, lease_s=spec.lease_seconds, restore_id=tx.uid, cancel=cancel
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
        return spec.checkpoint_id, location(spec.storage_location, context.settings)
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
    storage = location(checkpointed.storage_location, context.settings)
    if status.get("location") != storage.url:
        raise Refused(
            "StorageLocationChanged",
            f"Checkpoint {ref} was written to {status.get('location')}, but storage location {storage.name} is now "
            f"{storage.url}; restore it by checkpointId from a location that holds it",
        )
    return str(status["checkpointId"]), storage
