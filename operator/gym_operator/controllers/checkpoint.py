"""A Checkpoint's transaction: the coordinator's checkpoint of the stack its selector picks.

The checkpoint id is the resource's name and the start of its uid. The uid names the transaction: an operator
restarted mid-checkpoint repeats the same one, and a Checkpoint re-created under a deleted one's name is another
transaction, refused if its id is taken. What happens to a Checkpoint afterwards (its ``spec.ttl``, its deletion) is
:mod:`.deletion`'s.

A final Checkpoint (``spec.final``; the one :mod:`.termination` creates when a pod of the release terminates) is
persisted and published under the pause and never resumed, takes the stack's pods even while they are being deleted,
and goes before the stack's other checkpoints that wait; ``spec.deadline`` bounds any Checkpoint: not published by
then, it is aborted (reason ``DeadlinePassed``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import kopf

from gym_operator.controllers import resume
from gym_operator.controllers.catalog import synced
from gym_operator.controllers.context import Context, Refused, claimed_by, pod_selector
from gym_operator.controllers.location import resolve, usable
from gym_operator.controllers.transaction import Transaction, invalid, parse, run_once
from gym_operator.specs import CheckpointSpec, SelectorSpec, StorageLocation
from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import TransactionResult
from gym_services.coordination.transaction import TransactionPhase, TransactionStatus

#: what setup finds: the checkpoint id, the storage location, the participants
Prepared = tuple[str, StorageLocation, list[ParticipantRef]]
#: seconds of a deadline kept for capture, persist and publish once every participant reached a boundary
PUBLISH_RESERVE_S = 3.0
#: seconds between two claims of a final checkpoint whose storage did not answer (:func:`claim_again`)
CLAIM_RETRY_S = 1.0


def claim_again(result: TransactionResult, final: bool, left_s: float, cancel: asyncio.Event) -> bool:
    """Whether a final checkpoint that failed before it touched anything (its storage did not answer the claim) is
    tried again: its pods are going, so it keeps trying while its deadline leaves time to prepare and publish. A
    storage location briefly away (its Service replaced in the same rollout, its endpoint re-applied) costs seconds,
    not the stack's last state; any other checkpoint is run again by whoever asked for it (its schedule)."""
    untouched = result.status is TransactionStatus.FAILED and result.phase is TransactionPhase.PENDING
    return final and untouched and not cancel.is_set() and left_s > PUBLISH_RESERVE_S + 2 * CLAIM_RETRY_S


async def give_way_to_a_termination(tx: Transaction[Prepared], context: Context) -> None:
    """Right before a checkpoint that is not final prepares: a pod of its stack terminating now (since the stack was
    found) makes it give way, :class:`Refused` (``Superseded``), to the termination checkpoint. A server prepared
    after its signal would take this checkpoint as final and leave once its part is written, however the checkpoint
    ends; a server signalled only after its prepare takes it as any other. The kubelet signals a pod only after the
    API shows its deletion, so a look at the pods here leaves no gap worth the name."""
    for pod in await context.kube.list_pods(tx.namespace, pod_selector(tx.selector, context.settings)):
        if pod.metadata.deletion_timestamp is not None:
            raise Refused(
                "Superseded", f"pod {pod.metadata.name} is terminating: the termination checkpoint takes the stack"
            )


@contextlib.contextmanager
def at_deadline(tx: Transaction[Prepared], cancel: asyncio.Event) -> Iterator[None]:
    """Sets ``cancel`` when the transaction's deadline passes (the coordinator then aborts it, unless published)."""
    left = tx.left_s()
    if left == float("inf"):
        yield
        return

    def passed() -> None:
        if not cancel.is_set():
            tx.deadline_passed = True
            cancel.set()

    handle = asyncio.get_running_loop().call_later(max(0.0, left), passed)
    try:
        yield
    finally:
        handle.cancel()


async def run(stopped: kopf.DaemonStopped, body: kopf.Body, context: Context) -> None:
    """The daemon of one Checkpoint: its transaction, once (a final one is not run again). A Checkpoint the catalog
    sync made (:mod:`.catalog`) runs none: its checkpoint is stored already."""
    if synced(body):
        return
    spec, why = parse(CheckpointSpec, body.get("spec"))
    tx: Transaction[Prepared] = Transaction(
        "Checkpoint",
        "checkpoints",
        spec.selector if spec else SelectorSpec(),
        context,
        body,
        final=bool(spec and spec.final),
        deadline=spec.deadline if spec else None,
    )

    async def setup() -> Prepared:
        assert spec is not None
        storage = await resolve(spec.storage_location, tx.namespace, context)
        await usable(storage, True, tx.namespace, context)
        participants = await tx.participants()
        if spec.final or context.settings.auto_restore:
            why = await resume.nothing_new(context, tx.namespace, participants, final=spec.final)
            if why is not None:
                raise Refused("NothingNewToSave", f"the stack holds nothing newer than its newest checkpoint: {why}")
        return f"{tx.name}-{tx.uid[:8]}", storage, participants

    async def work(prepared: Prepared, cancel: asyncio.Event) -> TransactionResult:
        assert spec is not None
        checkpoint_id, storage, participants = prepared
        if not spec.final:
            await give_way_to_a_termination(tx, context)
        timeout_s = context.settings.checkpoint_call_timeout(spec)
        with at_deadline(tx, cancel):
            async with ControlClient(context.settings.token, timeout_s=timeout_s, fence=context.fence) as client:
                while True:
                    tx.fields.update(checkpointId=checkpoint_id, location=storage.url)
                    # a deadline bounds the wait for boundaries, and cancels (aborts) what is not published by then
                    prepare_timeout_s = max(1.0, min(spec.prepare_timeout_seconds, tx.left_s() - PUBLISH_RESERVE_S))
                    coordinator = await tx.coordinator(participants, storage, client)
                    result = await coordinator.checkpoint(
                        checkpoint_id,
                        storage.url,
                        prepare_timeout_s=prepare_timeout_s,
                        lease_s=spec.lease_seconds,
                        transaction_id=tx.uid,
                        claimed_by=claimed_by(tx.namespace, tx.name, context.settings.release),
                        method=spec.method,
                        cancel=cancel,
                        final=spec.final,
                    )
                    if not claim_again(result, spec.final, tx.left_s(), cancel):
                        return result
                    again = f"{result.error}; the final checkpoint claims its id again in {CLAIM_RETRY_S:g}s"
                    tx.event("Retrying", again)
                    await asyncio.sleep(CLAIM_RETRY_S)
                    storage = await resolve(spec.storage_location, tx.namespace, context)  # (it may have moved)

    await run_once(tx, stopped, setup if spec else invalid(why), work)
