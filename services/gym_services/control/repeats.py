"""Every control verb runs once per checkpoint id: a repeated call gets the first call's answer.

Used by the control plane (:mod:`gym_services.control.plane`), so a coordinator that retries (or an
operator restarted mid-transaction that runs the transaction again) changes nothing twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from gym_services.control.models import PhaseResponse, RestoreResponse
from gym_services.control.protocol import Verb

T = TypeVar("T")
#: restores remembered after they resumed (a coordinator re-run repeats them by restore id)
RESUMED_RESTORES_KEPT = 16
#: checkpoints whose closing answer is remembered (a coordinator's retry of resume or abort comes within seconds;
#: a server checkpointed every 30 s closes thousands a day)
CLOSED_KEPT = 16


class RepeatCalls:
    def __init__(self) -> None:
        self._running: dict[tuple[Verb, str], asyncio.Task[Any]] = {}
        #: the answer of the resume or abort that closed each of the newest :data:`CLOSED_KEPT` checkpoints
        self._closed: dict[str, tuple[Verb, PhaseResponse]] = {}
        #: restores this process installed and resumed: checkpoint id -> (restore id, answer)
        self._resumed_restores: dict[str, tuple[str, RestoreResponse]] = {}

    async def once(self, verb: Verb, checkpoint_id: str, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``work`` once per (verb, id); repeats wait for and return the same answer (a failed one may run
        again)."""
        key = (verb, checkpoint_id)
        task = self._running.get(key)
        if task is None:
            task = asyncio.create_task(work(), name=f"{verb}-{checkpoint_id}")
            self._running[key] = task
            task.add_done_callback(lambda t: self._forget_failed(key, t))
        return await asyncio.shield(task)

    def _forget_failed(self, key: tuple[Verb, str], task: asyncio.Task[Any]) -> None:
        if (task.cancelled() or task.exception() is not None) and self._running.get(key) is task:
            del self._running[key]

    def started(self, verb: Verb, checkpoint_id: str) -> bool:
        return (verb, checkpoint_id) in self._running

    def task(self, verb: Verb, checkpoint_id: str) -> asyncio.Task[Any] | None:
        return self._running.get((verb, checkpoint_id))

    def busy(self, checkpoint_id: str, verbs: Iterable[Verb]) -> list[asyncio.Task[Any]]:
        """The calls of ``verbs`` for this checkpoint still running."""
        wanted = set(verbs)
        return [t for (v, c), t in self._running.items() if c == checkpoint_id and v in wanted and not t.done()]

    def opened(self, checkpoint_id: str) -> None:
        """A checkpoint id starts again: its old closing answer no longer stands."""
        self._closed.pop(checkpoint_id, None)

    def closed(self, checkpoint_id: str) -> PhaseResponse | None:
        entry = self._closed.get(checkpoint_id)
        return None if entry is None else entry[1]

    def close(self, checkpoint_id: str, verb: Verb, response: PhaseResponse) -> None:
        """Remember how the checkpoint closed and cancel its calls still running (but the caller's own)."""
        self._closed[checkpoint_id] = (verb, response)
        _keep_newest(self._closed, CLOSED_KEPT)
        current = asyncio.current_task()
        for key in [k for k in self._running if k[1] == checkpoint_id]:
            task = self._running.pop(key)
            if not task.done() and task is not current:
                task.cancel()

    def resumed_restore(self, checkpoint_id: str, restore_id: str | None) -> RestoreResponse | None:
        """The answer of a restore with this id that this process already installed and resumed."""
        done = self._resumed_restores.get(checkpoint_id)
        return done[1] if done is not None and done[0] == restore_id else None

    def remember_resumed_restore(self, checkpoint_id: str, restore_id: str, answer: RestoreResponse) -> None:
        self._resumed_restores[checkpoint_id] = (restore_id, answer)
        _keep_newest(self._resumed_restores, RESUMED_RESTORES_KEPT)

    def cancel_all(self) -> None:
        for task in self._running.values():
            task.cancel()


def _keep_newest(entries: dict[str, Any], count: int) -> None:
    """Forget the oldest entries (a dict keeps the order they were added in) until ``count`` are left."""
    while len(entries) > count:
        del entries[next(iter(entries))]
