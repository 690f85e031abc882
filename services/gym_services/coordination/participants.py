"""The participants of one stack as a set: fan-out, the by-role order, pause leases, resume and abort.

Both transactions (:mod:`~gym_services.coordination.checkpoint`, :mod:`~gym_services.coordination.restore`)
and the coordinator's own calls (status, retire) reach the participants only through a
:class:`ParticipantSet`. It knows who the participants are and how to call them all at once
(:meth:`~ParticipantSet.each`, :meth:`~ParticipantSet.all`), in which order roles go
(:func:`by_role`: prepare in that order, resume and abort in reverse), how a transaction keeps the
pause leases of the participants it touched alive (:meth:`~ParticipantSet.leases`), and which
current participant stands for each one a checkpoint recorded (:meth:`~ParticipantSet.match`).
It holds no state of any transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

from pydantic import BaseModel

from gym_services.base.backoff import Backoff
from gym_services.base.errors import ErrorCode
from gym_services.control.models import (
    CheckpointRef,
    GlobalManifest,
    ManifestParticipant,
    PhaseResponse,
    Replica,
    RetireRequest,
    StatusResponse,
)
from gym_services.control.protocol import ROLE_ORDER, Role, Verb
from gym_services.coordination.client import ControlClient, ParticipantError, ParticipantRef
from gym_services.coordination.deadlines import DEADLINES, Deadlines
from gym_services.coordination.transaction import TransactionError

A = TypeVar("A", bound=BaseModel)

# how long an abort asks again a participant that refuses it while its restore or capture still runs (the
# transaction may have stopped waiting for that call, on a cancel); after that, the participant's lease reopens it
ABORT_BUSY_PATIENCE_S = 5.0

#: the order :meth:`ParticipantSet.retire` drops an attempt in: environment, then agent, then model and
#: resources together, the controller last
RETIRE_ORDER: tuple[tuple[Role, ...], ...] = (
    (Role.ENVIRONMENT,),
    (Role.AGENT,),
    (Role.MODEL, Role.RESOURCES),
    (Role.CONTROLLER,),
)


#: the order :meth:`ParticipantSet.resume` and :meth:`ParticipantSet.abort` reopen servers in: the servers the agents
#: call (environments, the model, resources servers) together, then the agents, the controller last; so no step of a
#: reopened agent meets a server still paused (``docs/decisions.md``, "Servers reopen before those that call them")
REOPEN_ORDER: tuple[tuple[Role, ...], ...] = (
    (Role.ENVIRONMENT, Role.MODEL, Role.RESOURCES),
    (Role.AGENT,),
    (Role.CONTROLLER,),
)


def effective_replica(participant_id: str, replica: Replica | None) -> Replica:
    """Which replica a participant is; one that does not say is the only replica of a server named as itself."""
    return replica or Replica(group=participant_id, ordinal=0, replicas=1)


def replica_counts(participants: Iterable[ParticipantRef | ManifestParticipant]) -> dict[str, int]:
    """Server (group) -> its replica count."""
    replicas = (effective_replica(p.participant_id, p.replica) for p in participants)
    return {r.group: r.replicas for r in replicas}


def check_replica_sets(participants: Iterable[ParticipantRef]) -> None:
    """Every replicated server is here whole: ordinals 0..n-1, each once, all agreeing on n.

    A replica holds sessions and episodes no other replica has, so a checkpoint without one of them
    would lose those rollouts; it is refused instead, naming what is missing."""
    groups: dict[str, list[Replica]] = {}
    for ref in participants:
        if ref.replica is not None:
            groups.setdefault(ref.replica.group, []).append(ref.replica)
    problems = []
    for group, replicas in sorted(groups.items()):
        counts = sorted({r.replicas for r in replicas})
        ordinals = sorted(r.ordinal for r in replicas)
        if len(counts) > 1:
            problems.append(f"{group}: its replicas disagree on how many there are ({counts})")
        elif ordinals != list(range(counts[0])):
            missing = sorted(set(range(counts[0])) - set(ordinals))
            twice = sorted({o for o in ordinals if ordinals.count(o) > 1})
            what = (f"ordinals {missing} did not answer" if missing else "") + (
                f"ordinals {twice} answer twice" if twice else ""
            )
            problems.append(f"{group}: runs {counts[0]} replicas but {what}")
    if problems:
        raise TransactionError(
            "the stack's replicated servers are incomplete: "
            + "; ".join(problems)
            + " (each replica holds rollouts no other replica has; wait until every replica runs and try again)"
        )


def by_role(participants: Iterable[ParticipantRef]) -> list[list[ParticipantRef]]:
    """Participants grouped in prepare order; one role's participants are driven together."""
    groups: dict[Role, list[ParticipantRef]] = {role: [] for role in ROLE_ORDER}
    for ref in participants:
        groups[ref.role].append(ref)
    return [groups[role] for role in ROLE_ORDER if groups[role]]


class ParticipantSet:
    """The participants of one stack and the client that calls them; ids are unique."""

    def __init__(self, refs: Iterable[ParticipantRef], client: ControlClient, deadlines: Deadlines = DEADLINES) -> None:
        self.refs = list(refs)
        ids = [p.participant_id for p in self.refs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"participant ids must be unique: {ids}")
        self.client = client
        self.deadlines = deadlines

    def __len__(self) -> int:
        return len(self.refs)

    def __iter__(self) -> Iterator[ParticipantRef]:
        return iter(self.refs)

    @property
    def ids(self) -> list[str]:
        return [p.participant_id for p in self.refs]

    def in_role_order(self) -> list[list[ParticipantRef]]:
        """The participants grouped by role, in prepare order (:func:`by_role`)."""
        return by_role(self.refs)

    def check_complete(self) -> None:
        """Refuse (:class:`TransactionError`) a set whose replicated servers are incomplete
        (:func:`check_replica_sets`)."""
        check_replica_sets(self.refs)

    # --- fan-out ------------------------------------------------------------------------

    async def each(
        self, refs: list[ParticipantRef], verb: Verb, call: Callable[[ParticipantRef], Awaitable[A]]
    ) -> tuple[dict[str, A], dict[str, ParticipantError]]:
        """``call`` every ref concurrently; answers and failures by participant id."""
        results = await asyncio.gather(*(call(r) for r in refs), return_exceptions=True)
        ok: dict[str, A] = {}
        failed: dict[str, ParticipantError] = {}
        for ref, res in zip(refs, results, strict=True):
            if isinstance(res, ParticipantError):
                failed[ref.participant_id] = res
            elif isinstance(res, BaseException):
                failed[ref.participant_id] = ParticipantError(ref, verb, f"{type(res).__name__}: {res}")
            else:
                ok[ref.participant_id] = res
        return ok, failed

    async def all(
        self, refs: list[ParticipantRef], verb: Verb, call: Callable[[ParticipantRef], Awaitable[A]]
    ) -> dict[str, A]:
        """Like :meth:`each`, but any failure fails the step (:class:`TransactionError`)."""
        ok, failed = await self.each(refs, verb, call)
        if failed:
            raise TransactionError("; ".join(str(e) for e in failed.values()))
        return ok

    # --- pause leases, resume, abort ----------------------------------------------------

    @contextlib.asynccontextmanager
    async def leases(self, checkpoint_id: str, lease_s: float) -> AsyncIterator[list[ParticipantRef]]:
        """Renew the pause lease of every participant in the yielded list while the block runs.

        The transaction adds a participant to the list as it touches it (its prepare or restore call
        goes out), and clears the list once every one is resumed."""
        touched: list[ParticipantRef] = []
        ref_of = CheckpointRef(checkpoint_id=checkpoint_id)

        async def renew() -> None:
            while True:
                await asyncio.sleep(self.deadlines.renew_interval(lease_s))
                for ref in list(touched):
                    with contextlib.suppress(ParticipantError):
                        await self.client.lease(ref, ref_of, timeout_s=self.deadlines.renew_call(lease_s))

        task = asyncio.create_task(renew())
        try:
            yield touched
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def resume(
        self, checkpoint_id: str, refs: list[ParticipantRef], seconds: dict[str, float] | None = None
    ) -> list[str]:
        """Resume ``refs``, in :data:`REOPEN_ORDER`; warnings for those that did not answer. ``seconds``, when given,
        gets how long each role's resume took (from its group's start until its last participant answered), by
        role."""
        return await self._finish(Verb.RESUME, checkpoint_id, refs, seconds)

    async def abort(self, checkpoint_id: str, refs: list[ParticipantRef]) -> list[str]:
        """Abort ``refs``, in :data:`REOPEN_ORDER` (nothing stays paused or installed); warnings for those that
        did not answer. One still capturing or restoring is asked again for :data:`ABORT_BUSY_PATIENCE_S`."""
        return await self._finish(Verb.ABORT, checkpoint_id, refs)

    async def _finish(
        self, verb: Verb, checkpoint_id: str, refs: list[ParticipantRef], seconds: dict[str, float] | None = None
    ) -> list[str]:
        req = CheckpointRef(checkpoint_id=checkpoint_id)
        finish = self.client.resume if verb is Verb.RESUME else self.client.abort
        warnings: list[str] = []
        took: dict[str, float] = {} if seconds is None else seconds
        for roles in REOPEN_ORDER:
            group = [r for r in refs if r.role in roles]
            if not group:
                continue
            started = time.monotonic()

            async def timed(ref: ParticipantRef, started: float = started) -> PhaseResponse:
                try:
                    return await finish(ref, req)
                finally:
                    took[ref.role] = max(took.get(ref.role, 0.0), time.monotonic() - started)

            _, failed = await self.each(group, verb, timed)
            busy = Backoff(first_s=0.05, max_s=0.5, deadline_s=ABORT_BUSY_PATIENCE_S)
            while verb is Verb.ABORT and (
                waiting := [e.ref for e in failed.values() if e.code == ErrorCode.CHECKPOINT_BUSY]
            ):
                # a restore or capture still running there (the transaction stopped waiting for it, e.g. on a
                # cancel) refuses abort until it ends: ask again for a few seconds, then leave it to its lease
                if not busy.failed():
                    break
                await asyncio.sleep(busy.wait_s())
                _, again = await self.each(waiting, verb, lambda r: finish(r, req))
                failed = {pid: err for pid, err in failed.items() if pid not in {r.participant_id for r in waiting}}
                failed.update(again)
            for err in failed.values():
                if err.code == ErrorCode.UNKNOWN_CHECKPOINT:
                    continue  # already closed (lease expiry, or it never got the checkpoint)
                warnings.append(f"{err} (its lease will reopen it)")
        return warnings

    # --- outside any transaction ----------------------------------------------------------

    async def retire(self, rollout_id: str, attempt: int) -> dict[str, bool]:
        """Drop one attempt everywhere, in :data:`RETIRE_ORDER`; participant id -> whether it held the attempt."""
        req = RetireRequest(rollout_id=rollout_id, attempt=attempt)
        dropped: dict[str, bool] = {}
        for roles in RETIRE_ORDER:
            group = [p for p in self.refs if p.role in roles]
            if group:
                ok = await self.all(group, Verb.RETIRE, lambda r: self.client.retire(r, req))
                dropped.update({pid: a.retired for pid, a in ok.items()})
        return dropped

    async def status(self) -> dict[str, StatusResponse | ParticipantError]:
        """Every participant's status, or why it could not be read."""
        ok, failed = await self.each(self.refs, Verb.STATUS, lambda r: self.client.status(r))
        return {p.participant_id: ok.get(p.participant_id) or failed[p.participant_id] for p in self.refs}

    # --- matching a checkpoint's participants ---------------------------------------------

    def match(self, checkpoint_id: str, manifest: GlobalManifest) -> list[ParticipantRef]:
        """The current participant for each one in the checkpoint (same id, same role, same replica), in
        manifest order; a replicated server must run as many replicas as it did at the checkpoint."""
        self.check_complete()
        # a checkpoint written before replicas were recorded names none: its participants match by id alone
        recorded = [p for p in manifest.participants if p.replica is not None]
        then = replica_counts(recorded)
        now = replica_counts(self.refs)
        differ = sorted(g for g in then if now.get(g, 0) != then[g])
        if differ:
            counts = "; ".join(f"{g}: {then[g]} in the checkpoint, {now.get(g, 0)} here" for g in differ)
            raise TransactionError(
                f"checkpoint {checkpoint_id} was taken with other replica counts ({counts}). Each replica's sessions "
                "and episodes are restored into the replica of the same ordinal, so the counts must match: run the "
                "stack with the checkpoint's replica counts (replicas: in the stack YAML, servers[].replicas in the "
                "chart's values) and restore again"
            )
        current = {p.participant_id: p for p in self.refs}

        def place(p: ParticipantRef | ManifestParticipant) -> tuple[str, int]:
            replica = effective_replica(p.participant_id, p.replica)
            return replica.group, replica.ordinal

        moved = [
            p.participant_id
            for p in recorded
            if p.participant_id in current and place(current[p.participant_id]) != place(p)
        ]
        if moved:
            raise TransactionError(
                f"checkpoint {checkpoint_id}: participants {moved} are other replicas here than in the checkpoint"
            )
        missing = [p.participant_id for p in manifest.participants if p.participant_id not in current]
        wrong_role = [
            p.participant_id
            for p in manifest.participants
            if p.participant_id in current and current[p.participant_id].role != p.role
        ]
        if missing or wrong_role:
            raise TransactionError(
                f"checkpoint {checkpoint_id} needs participants that are not here: "
                f"missing {missing}, wrong role {wrong_role}"
            )
        return [current[p.participant_id] for p in manifest.participants]
