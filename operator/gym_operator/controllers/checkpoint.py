"""A Checkpoint's transaction: the coordinator's checkpoint of the stack its selector picks.

The checkpoint id is the resource's name and the start of its uid. The uid names the transaction: an operator
restarted mid-checkpoint repeats the same one, and a Checkpoint re-created under a deleted one's name is another
transaction, refused if its id is taken. What happens to a Checkpoint afterwards (its ``spec.ttl``, its deletion) is
:mod:`.deletion`'s.
"""

from __future__ import annotations

import asyncio

import kopf

from gym_operator.controllers.catalog import synced
from gym_operator.controllers.context import Context, claimed_by
from gym_operator.controllers.location import resolve, usable
from gym_operator.controllers.transaction import Transaction, invalid, parse, run_once
from gym_operator.specs import CheckpointSpec, SelectorSpec, StorageLocation
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import TransactionResult

#: what setup finds: the checkpoint id, the storage location, the participants
Prepared = tuple[str, StorageLocation, list[ParticipantRef]]


async def run(stopped: kopf.DaemonStopped, body: kopf.Body, context: Context) -> None:
    """The daemon of one Checkpoint: its transaction, once (a final one is not run again). A Checkpoint the catalog
    sync made (:mod:`.catalog`) runs none: its checkpoint is stored already."""
    if synced(body):
        return
    spec, why = parse(CheckpointSpec, body.get("spec"))
    tx: Transaction[Prepared] = Transaction(
        "Checkpoint", "checkpoints", spec.selector if spec else SelectorSpec(), context, body
    )

    async def setup() -> Prepared:
        assert spec is not None
        storage = await resolve(spec.storage_location, tx.namespace, context)
        await usable(storage, True, tx.namespace, context)
        return f"{tx.name}-{tx.uid[:8]}", storage, await tx.participants()

    async def work(prepared: Prepared, cancel: asyncio.Event) -> TransactionResult:
        assert spec is not None
        checkpoint_id, storage, participants = prepared
        tx.fields.update(checkpointId=checkpoint_id, location=storage.url)
        timeout_s = context.settings.checkpoint_call_timeout(spec)
        async with ControlClient(context.settings.token, timeout_s=timeout_s, fence=context.fence) as client:
            coordinator = await tx.coordinator(participants, storage, client)
            return await coordinator.checkpoint(
                checkpoint_id,
                storage.url,
                prepare_timeout_s=spec.prepare_timeout_seconds,
                lease_s=spec.lease_seconds,
                transaction_id=tx.uid,
                claimed_by=claimed_by(tx.namespace, tx.name, context.settings.release),
                method=spec.method,
                cancel=cancel,
            )

    await run_once(tx, stopped, setup if spec else invalid(why), work)
