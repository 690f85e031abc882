"""When a transaction stops waiting (:class:`Cancellation`): between steps, and raced against a step that waits."""

from __future__ import annotations

import asyncio

import pytest

from gym_services.coordination.transaction import Cancellation, TransactionCancelled, TransactionError


async def slow(done: list[str], seconds: float = 30.0) -> str:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        done.append("cancelled")
        raise
    done.append("finished")
    return "answer"


async def test_without_an_event_nothing_stops_the_work() -> None:
    cancellation = Cancellation()
    cancellation.check()
    assert await cancellation.guard(slow([], 0.01)) == "answer"


async def test_a_set_event_fails_the_next_check_as_a_transaction_error() -> None:
    event = asyncio.Event()
    cancellation = Cancellation(event)
    cancellation.check()
    event.set()
    with pytest.raises(TransactionCancelled) as raised:
        cancellation.check()
    assert isinstance(raised.value, TransactionError) and str(raised.value).startswith("cancelled")


async def test_a_cancel_stops_the_guarded_work_at_once() -> None:
    event = asyncio.Event()
    done: list[str] = []
    asyncio.get_running_loop().call_later(0.05, event.set)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TransactionCancelled):
        await Cancellation(event).guard(slow(done))
    assert done == ["cancelled"] and loop.time() - started < 5


async def test_work_that_ends_first_gives_its_answer_or_its_error() -> None:
    event = asyncio.Event()
    assert await Cancellation(event).guard(slow([], 0.01)) == "answer"

    async def failing() -> None:
        raise TransactionError("a participant refused")

    with pytest.raises(TransactionError, match="a participant refused"):
        await Cancellation(event).guard(failing())


async def test_cancelling_the_caller_cancels_the_guarded_work_too() -> None:
    """The operator stopping a daemon cancels the transaction's task: no orphan keeps calling participants."""
    done: list[str] = []
    guarded = asyncio.create_task(Cancellation(asyncio.Event()).guard(slow(done)))
    await asyncio.sleep(0.05)
    guarded.cancel()
    with pytest.raises(asyncio.CancelledError):
        await guarded
    await asyncio.sleep(0)
    assert done == ["cancelled"]
