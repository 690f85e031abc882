"""The final checkpoint of a terminating local stack: taken once, within the deadline, tried again while time is left.

The supervisor (:mod:`gym_services.stack.supervisor`) calls :func:`take_final` when a server of the stack (or the
supervisor itself) got SIGTERM, and ``gymckpt down`` does when no supervisor runs. The checkpoint is final
(``docs/protocol.md``, "Termination"): written under the pause and never resumed, so nothing the servers do after it
counts. It must be published before the first terminating server's deadline, when that server exits whatever
happens; a failed attempt (storage unreachable, a server busy with the previous checkpoint's upload) is tried again
while enough of the grace is left, and a failure leaves nothing published: the stack then resumes from its newest
scheduled checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from gym_services.control.protocol import DEFAULT_PREPARE_TIMEOUT_S
from gym_services.coordination.coordinator import Coordinator, TransactionResult
from gym_services.coordination.transaction import TransactionKind, TransactionPhase, TransactionStatus

#: an attempt is started only with at least this long left before the deadline (a final checkpoint of a small stack
#: takes about a second; one started later would be cut off by the servers exiting)
MIN_ATTEMPT_S = 1.0
#: the publish must land this long before the deadline: the servers' exit is what the deadline bounds
DEADLINE_MARGIN_S = 0.5
#: pause between tries
RETRY_AFTER_S = 0.5


def final_checkpoint_id(now: float | None = None) -> str:
    return f"final-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:6]}"


@dataclass
class FinalOutcome:
    """How the final checkpoint went: the published result, or the last failure; how many tries."""

    result: TransactionResult | None
    tries: int
    error: str | None

    @property
    def published(self) -> bool:
        return self.result is not None and self.result.completed


async def take_final(
    coordinator: Coordinator,
    location: str,
    deadline: float,
    *,
    claimed_by: str,
    on_try: Callable[[str, int], None] | None = None,
    hopeless: Callable[[], str | None] | None = None,
) -> FinalOutcome:
    """Take the final checkpoint of ``coordinator``'s participants at ``location`` before the monotonic
    ``deadline``: tries while time is left, each bounded by it. ``on_try(checkpoint_id, n)`` is told of each;
    ``hopeless()`` names why another attempt cannot succeed (a participant's process is gone), ending the tries."""
    tries, error = 0, "no time was left for a final checkpoint"
    while (left := deadline - DEADLINE_MARGIN_S - time.monotonic()) >= MIN_ATTEMPT_S:
        if tries and hopeless is not None and (why := hopeless()) is not None:
            return FinalOutcome(None, tries, f"{error}; not tried again: {why}")
        tries += 1
        checkpoint_id = final_checkpoint_id()
        if on_try is not None:
            on_try(checkpoint_id, tries)
        result = await _attempt(coordinator, location, checkpoint_id, left, claimed_by)
        if result.completed:
            return FinalOutcome(result, tries, None)
        error = result.error or "failed"
        await asyncio.sleep(min(RETRY_AFTER_S, max(0.0, deadline - time.monotonic())))
    return FinalOutcome(None, tries, error)


async def _attempt(
    coordinator: Coordinator, location: str, checkpoint_id: str, left_s: float, claimed_by: str
) -> TransactionResult:
    """One attempt, ended as failed when the time left runs out (the servers are about to exit)."""
    cancel = asyncio.Event()
    # the prepare may use half the time left: the capture, the persist and the publish need the rest
    prepare_s = max(0.2, min(DEFAULT_PREPARE_TIMEOUT_S, left_s / 2))
    transaction = asyncio.ensure_future(
        coordinator.checkpoint(
            checkpoint_id,
            location,
            prepare_timeout_s=prepare_s,
            lease_s=max(2.0, left_s),
            claimed_by=claimed_by,
            cancel=cancel,
            final=True,
        )
    )
    try:
        return await asyncio.wait_for(asyncio.shield(transaction), left_s)
    except TimeoutError:
        cancel.set()  # what can still be undone is aborted; a persist stuck on storage is left to the deadline
        try:
            return await asyncio.wait_for(asyncio.shield(transaction), DEADLINE_MARGIN_S)
        except TimeoutError:
            transaction.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await transaction
            return _timed_out(checkpoint_id, location, left_s)


def _timed_out(checkpoint_id: str, location: str, left_s: float) -> TransactionResult:
    return TransactionResult(
        kind=TransactionKind.CHECKPOINT,
        checkpoint_id=checkpoint_id,
        location=location,
        status=TransactionStatus.FAILED,
        phase=TransactionPhase.FAILED,
        error=f"not published within the {left_s:.1f}s the termination grace left (is storage reachable?)",
    )
