"""The restore transaction on its own, over in-process participants and a ``file://`` store: the decision is the
point of no return. A participant's lease that ran out before it (an ``abort`` decision) undoes the restore
everywhere; a decision whose put landed but whose answer was lost still holds; a restore abandoned earlier is
refused before anyone is touched."""

from __future__ import annotations

import pytest
from tests.services.coordination.recorders import fresh_stack, run
from tests.support.asgi import TOKEN, serve_many

from gym_services.control import layout
from gym_services.control.protocol import Decision
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient
from gym_services.coordination.participants import ParticipantSet
from gym_services.coordination.restore import RestoreTransaction
from gym_services.coordination.results import Progress
from gym_services.coordination.transaction import TransactionKind


@pytest.fixture
async def checkpointed(stack, tmp_path):
    """A published checkpoint ``ck-1`` of the stack, and a fresh stack of the same participants to restore into."""
    location = f"file://{tmp_path}"
    taken = await run(stack, lambda coordinator, transport, events: coordinator.checkpoint("ck-1", location))
    assert taken.status == "completed", taken.error
    _apps, _parts, refs, _journal = stack
    journal: list[str] = []
    apps, parts = fresh_stack(refs, journal)
    return location, (apps, parts, refs, journal)


async def restore(fresh, location: str, transaction=RestoreTransaction, store: CheckpointStore | None = None):
    """Run restore ``rs-1`` of ``ck-1``; its result and every participant's status afterwards."""
    apps, _parts, refs, _journal = fresh
    async with serve_many(apps) as transport, ControlClient(TOKEN, transport=transport) as client:
        participants = ParticipantSet(refs, client)
        progress = Progress(TransactionKind.RESTORE, "ck-1", location, restore_id="rs-1")
        store = store or CheckpointStore(open_storage(location))
        result = await transaction(participants, store, progress, lease_s=30).run()
        return result, await participants.status()


async def test_a_lease_that_ran_out_before_the_decision_undoes_the_restore_everywhere(checkpointed) -> None:
    location, fresh = checkpointed
    _apps, parts, _refs, _journal = fresh

    class LeaseRanOut(RestoreTransaction):
        async def restore_all(self, refs, entries):
            restored = await super().restore_all(refs, entries)
            # as a participant whose lease expired would: it settles the restore as abandoned first
            self.store.settle(self.checkpoint_id, self.restore_id, Decision.ABORT, "agent-a")
            return restored

    result, statuses = await restore(fresh, location, transaction=LeaseRanOut)
    assert result.status == "failed" and "lease ran out before restore rs-1 was decided" in result.error
    assert all(not p.installed for p in parts.values())
    assert all(s.admission_open and s.live in ({}, {"sessions": 0}) for s in statuses.values())
    assert CheckpointStore(open_storage(location)).decision("ck-1", "rs-1") == Decision.ABORT

    again, _ = await restore(fresh, location)  # the same restore id, later: refused before anyone is touched
    assert again.status == "failed" and "was abandoned earlier" in again.error and again.participants == []


async def test_a_decision_whose_answer_was_lost_still_holds(checkpointed) -> None:
    """Storage stored the decision and then failed to answer: the transaction reads back what holds and completes."""
    location, fresh = checkpointed
    _apps, parts, _refs, _journal = fresh
    storage = open_storage(location)
    put_if_absent = storage.put_if_absent

    def lose_the_answer(key: str, data: bytes) -> None:
        put_if_absent(key, data)
        if key == layout.restore_decision_key("ck-1", "rs-1"):
            raise StorageError("connection reset after the put")

    storage.put_if_absent = lose_the_answer
    result, statuses = await restore(fresh, location, store=CheckpointStore(storage))
    assert result.status == "completed", result.error
    assert result.episodes == {"r1": 1, "r2": 1} and parts["controller"].installed == ["episode-r1", "episode-r2"]
    assert all(s.admission_open for s in statuses.values())


def test_a_restore_transaction_needs_its_restore_id(stack) -> None:
    _apps, _parts, refs, _journal = stack
    with pytest.raises(ValueError, match="needs its restore id"):
        RestoreTransaction(
            ParticipantSet(refs, ControlClient(TOKEN)),
            CheckpointStore(open_storage("file:///nowhere")),
            Progress(TransactionKind.RESTORE, "ck-1", "file:///nowhere"),
            lease_s=1,
        )
