"""A client of the token ledgers of a (replicated) policy model, for a trainer or its transport.

Each rollout's ledger lives on the replica its calls go to (``docs/decisions.md``, "The token ledger
lives with the rollout's policy model replica"), so the client sends every call about a rollout to
the replica :func:`~gym_services.base.affinity.replica_for` names among ``endpoints`` (the policy
model's base URLs in ordinal order, or a ``{a..b}`` range). Bodies and answers are the wire models of
:mod:`.wire`; a refusal raises :class:`LedgerRefused` with the server's error code. A call refused while a
checkpoint pauses the replica (``409 checkpoint_parked``: a stack that checkpoints itself on a schedule pauses every
few seconds) is asked again after its ``Retry-After``, for up to ``parked_patience_s``. It needs pydantic and httpx
only, so a trainer's environment can load it from the source tree.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from gym_services.base.affinity import expand_endpoints, replica_for
from gym_services.models.policy_model.ledger.wire import (
    CallRef,
    CallResult,
    DropRequest,
    DropResult,
    FrozenRollout,
    LedgerEntry,
    PutEntry,
    PutResult,
    Resolution,
    ResolveRequest,
    RolloutRef,
)

A = TypeVar("A", bound=BaseModel)


class LedgerRefused(Exception):
    """The ledger answered a 4xx: ``code`` is its error code (``stale_attempt``, ``ledger_closed``, ...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class LedgerClient:
    """``put``/``begin_call``/``mark_incomplete`` (writes of one attempt), ``freeze``/``drop``, ``resolve``."""

    def __init__(self, endpoints: str | list[str], timeout_s: float = 30.0, parked_patience_s: float = 120.0) -> None:
        self.urls = expand_endpoints(endpoints)
        self.http = httpx.AsyncClient(timeout=timeout_s)
        self.parked_patience_s = parked_patience_s

    def url_for(self, rollout_id: str) -> str:
        return self.urls[replica_for(rollout_id, len(self.urls))]

    async def _call(
        self, route: str, rollout_id: str, body: BaseModel, answer: type[A], attempt: int | None = None
    ) -> A:
        headers = None if attempt is None else {"x-ng-rollout-id": rollout_id, "x-ng-attempt": str(attempt)}
        url, content = f"{self.url_for(rollout_id)}/v1/ledger/{route}", body.model_dump(mode="json")
        deadline = time.monotonic() + self.parked_patience_s
        while True:
            resp = await self.http.post(url, json=content, headers=headers)
            if resp.status_code != 409 or "checkpoint_parked" not in resp.text or time.monotonic() > deadline:
                break
            await asyncio.sleep(float(resp.headers.get("retry-after") or 0.1))  # paused: the checkpoint resumes it
        if 400 <= resp.status_code < 500:
            try:
                error = resp.json()["error"]
                code, message = str(error["code"]), str(error["message"])
            except (ValueError, KeyError, TypeError):
                code, message = "bad_request", resp.text[:500]
            raise LedgerRefused(resp.status_code, code, message)
        resp.raise_for_status()
        return answer.model_validate(resp.json())

    async def put(self, entry: LedgerEntry, attempt: int = 0) -> PutResult:
        return await self._call("put", entry.rollout_id, PutEntry(entry=entry), PutResult, attempt)

    async def begin_call(self, rollout_id: str, model_call_id: str, attempt: int = 0) -> CallResult:
        body = CallRef(rollout_id=rollout_id, model_call_id=model_call_id)
        return await self._call("begin_call", rollout_id, body, CallResult, attempt)

    async def mark_incomplete(
        self, rollout_id: str, model_call_id: str = "", attempt: int = 0, reason: str = ""
    ) -> CallResult:
        body = CallRef(rollout_id=rollout_id, model_call_id=model_call_id, reason=reason)
        return await self._call("mark_incomplete", rollout_id, body, CallResult, attempt)

    async def freeze(self, rollout_id: str) -> FrozenRollout:
        return await self._call("freeze", rollout_id, RolloutRef(rollout_id=rollout_id), FrozenRollout)

    async def drop(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        body = DropRequest(rollout_id=rollout_id, snapshot_id=snapshot_id, version=version)
        return (await self._call("drop", rollout_id, body, DropResult)).dropped

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> Resolution:
        body = ResolveRequest(rollout_id=rollout_id, request_items=request_items)
        return await self._call("resolve", rollout_id, body, Resolution)

    async def close(self) -> None:
        await self.http.aclose()
