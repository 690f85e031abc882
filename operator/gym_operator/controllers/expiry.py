"""A Checkpoint's expiry (``spec.ttl``, as Velero's): once its transaction has ended, ``status.expiration`` is its
creation plus ``spec.ttl`` (kept up to date when the ttl changes); once that passes, the operator deletes the
Checkpoint (its ``deletionPolicy`` then decides about the stored objects: :mod:`.deletion`).

One :class:`Expiry` per operator, fed by the watch (kopf's ``on.event``, a handler that needs no finalizer): a
Checkpoint with a ttl holds no finalizer for its expiry, so it never holds up the deletion of its namespace or CRD.
It follows only Checkpoints whose transaction has ended (a ttl shorter than the transaction never cancels it) and
whose spec is valid (an invalid one failed: nothing of it is stored). One task writes the expirations and deletes
what expired, waking at the next expiration or when the watch shows a change.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

from gym_operator.controllers.context import FINAL, Context
from gym_operator.specs import CheckpointSpec, SpecError

log = logging.getLogger("gym.operator")

#: seconds before a failed expiration write or deletion is tried again
RETRY_S = 5.0
#: the longest the task sleeps without looking (a clock jump, a missed wake-up)
MAX_SLEEP_S = 60.0


def expiration(body: Mapping[str, Any]) -> dt.datetime | None:
    """When the Checkpoint expires: its creation plus ``spec.ttl`` (None: no ttl, or an invalid spec)."""
    try:
        ttl = CheckpointSpec.parse(body.get("spec")).ttl
    except SpecError:
        return None
    created = (body.get("metadata") or {}).get("creationTimestamp")
    if ttl is None or not created:
        return None
    return dt.datetime.fromisoformat(created.replace("Z", "+00:00")) + ttl


def stamp_of(when: dt.datetime | None) -> str | None:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else None


class Expiry:
    """The ended Checkpoints of the release that have (or had) a ttl, as the watch last showed them, and the task that
    expires them."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self.tracked: dict[str, dict[str, Any]] = {}  # uid -> the body last seen
        self.retry_at: dict[str, float] = {}  # uid -> when a failed write or deletion is tried again
        self.wake = asyncio.Event()

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event of a Checkpoint of the release (``on.event``)."""
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        status = body.get("status") or {}
        follow = (
            event_type != "DELETED"
            and not meta.get("deletionTimestamp")
            and status.get("phase") in FINAL
            and (expiration(body) is not None or status.get("expiration") is not None)
        )
        if not follow:
            self.tracked.pop(uid, None)
            self.retry_at.pop(uid, None)
            return
        self.tracked[uid] = {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": dict(meta),
            "spec": dict(body.get("spec") or {}),
            "status": dict(status),
        }
        self.wake.set()

    async def run(self) -> None:
        """Until cancelled (the operator stops): expire what is due, sleep until the next is."""
        while True:
            self.wake.clear()
            due_in = await self.sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), min(due_in, MAX_SLEEP_S))

    async def sweep(self) -> float:
        """Write each changed expiration, delete each expired Checkpoint; the seconds until the next is due."""
        loop = asyncio.get_running_loop()
        due_in = MAX_SLEEP_S
        for uid, body in list(self.tracked.items()):
            retry = self.retry_at.get(uid, 0.0) - loop.time()
            if retry > 0:
                due_in = min(due_in, retry)
                continue
            try:
                left = await self._expire(body)
            except Exception as exc:  # an API error, or a bug: said, and tried again later; the task goes on
                log.warning(
                    f"Checkpoint {body['metadata'].get('name')}: expiry failed ({exc!r}); retrying in {RETRY_S:g}s"
                )
                self.retry_at[uid] = loop.time() + RETRY_S
                due_in = min(due_in, RETRY_S)
                continue
            if left is not None:
                due_in = min(due_in, left)
        return max(due_in, 0.0)

    async def _expire(self, body: dict[str, Any]) -> float | None:
        """One Checkpoint: its expiration written; deleted when it has passed (None), else the seconds left."""
        meta, status = body["metadata"], body["status"]
        when = expiration(body)
        stamp = stamp_of(when)
        if stamp != status.get("expiration"):
            update = {"expiration": stamp}
            if meta.get("generation") is not None:
                update["observedGeneration"] = meta["generation"]
            self.context.fence()
            await self.context.kube.patch_status(
                "checkpoints", meta["namespace"], meta["name"], update, meta.get("resourceVersion")
            )
            status["expiration"] = stamp  # (the watch shows it soon; until then this is what it holds)
        if when is None:
            self.tracked.pop(meta["uid"], None)  # the ttl was removed and so is the expiration
            return None
        left = (when - dt.datetime.now(dt.UTC)).total_seconds()
        if left > 0:
            return left
        await self.context.kube.delete_object("checkpoints", meta["namespace"], meta["name"], meta["uid"])
        self.tracked.pop(meta["uid"], None)
        message = f"spec.ttl ran out at {stamp}: the Checkpoint is deleted"
        await self.context.kube.event(body, "Expired", message)
        return None
