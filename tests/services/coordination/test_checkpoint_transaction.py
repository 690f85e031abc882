"""The checkpoint transaction on its own, over in-process participants and a ``file://`` store: a checkpoint that
stops before it publishes (cancelled after the pause, or past the claim's bound) publishes nothing, records its
failure and leaves every participant open; a persist that does not match its capture fails it."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from tests.support.asgi import TOKEN, serve_many

from gym_services.control import layout
from gym_services.control.protocol import CheckpointMethod
from gym_services.control.storage import open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.checkpoint import Captured, CheckpointTransaction
from gym_services.coordination.client import ControlClient
from gym_services.coordination.participants import ParticipantSet
from gym_services.coordination.results import Progress
from gym_services.coordination.transaction import (
    Cancellation,
    TransactionKind,
    TransactionPhase,
    TransactionResult,
)


async def take(stack, location: str, method: str, transaction=CheckpointTransaction, cancel=None, on_phase=None):
    """Run one checkpoint transaction ``ck-1``; its result and every participant's status afterwards."""
    apps, _parts, refs, _journal = stack
    phases: list[TransactionPhase] = []

    def sink(phase: TransactionPhase, detail: dict) -> None:
        phases.append(phase)
        if on_phase is not None:
            on_phase(phase)

    async with serve_many(apps) as transport, ControlClient(TOKEN, transport=transport) as client:
        participants = ParticipantSet(refs, client)
        progress = Progress(TransactionKind.CHECKPOINT, "ck-1", location, sink=sink, transaction_id="tx-1")
        run = transaction(
            participants,
            CheckpointStore(open_storage(location)),
            progress,
            prepare_timeout_s=5,
            lease_s=30,
            method=CheckpointMethod(method),
            cancellation=Cancellation(cancel),
        )
        result = await run.run()
        statuses = await participants.status()
    return result, statuses, phases


def assert_nothing_published(result: TransactionResult, statuses, location: str) -> None:
    storage = open_storage(location)
    assert result.status == "failed"
    assert not storage.exists(layout.global_manifest_key("ck-1"))
    assert json.loads(storage.get(layout.tombstone_key("ck-1")))["reason"] == "failed"  # reclaimed at once
    assert all(s.admission_open and s.checkpoint_id is None for s in statuses.values())


async def test_a_cancel_after_the_pause_publishes_nothing(stack, tmp_path) -> None:
    """Cancelled while every participant writes in the background (resumed already): the uploads are abandoned,
    the global manifest is never written, and the failure is recorded."""
    location = f"file://{tmp_path}"
    cancel = asyncio.Event()

    def on_phase(phase: TransactionPhase) -> None:
        if phase is TransactionPhase.PERSISTING:
            cancel.set()

    result, statuses, phases = await take(stack, location, "background", cancel=cancel, on_phase=on_phase)
    assert_nothing_published(result, statuses, location)
    assert result.error.startswith("cancelled") and result.phase is TransactionPhase.PERSISTING
    assert phases[-2:] == [TransactionPhase.ABORTING, TransactionPhase.FAILED]
    assert result.pause_s > 0 and "published" not in result.timings


@pytest.mark.parametrize("method", ["background", "sync"])
async def test_past_the_claims_bound_nothing_is_published(stack, tmp_path, method) -> None:
    """The claim bounds when the manifest may still be written: a transaction that reaches publishing later fails
    there and publishes nothing, under the pause (sync) or after it."""
    location = f"file://{tmp_path}"

    class Late(CheckpointTransaction):
        async def claim(self):
            existing = await super().claim()
            self.publish_by = time.time()  # passed by the time it publishes
            return existing

    result, statuses, _ = await take(stack, location, method, transaction=Late)
    assert_nothing_published(result, statuses, location)
    assert "was not published within" in result.error and result.phase is TransactionPhase.PUBLISHING


async def test_a_persist_that_does_not_match_its_capture_fails_the_checkpoint(stack, tmp_path) -> None:
    location = f"file://{tmp_path}"

    class Miscounted(CheckpointTransaction):
        async def capture_all(self) -> Captured:
            captured = await super().capture_all()
            answers = dict(captured.answers)
            answers["controller"] = answers["controller"].model_copy(update={"records": 99})
            return Captured(answers, captured.episodes)

    result, statuses, _ = await take(stack, location, "sync", transaction=Miscounted)
    assert_nothing_published(result, statuses, location)
    assert "participant controller persisted 2 records but captured 99" in result.error


def test_a_checkpoint_transaction_needs_its_transaction_id(stack) -> None:
    _apps, _parts, refs, _journal = stack
    with pytest.raises(ValueError, match="needs its transaction id"):
        CheckpointTransaction(
            ParticipantSet(refs, ControlClient(TOKEN)),
            CheckpointStore(open_storage("file:///nowhere")),
            Progress(TransactionKind.CHECKPOINT, "ck-1", "file:///nowhere"),
            prepare_timeout_s=1,
            lease_s=1,
            method=CheckpointMethod.SYNC,
        )
