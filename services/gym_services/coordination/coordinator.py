"""The checkpoint and restore transactions over a set of participants (``docs/protocol.md``).

Free of kopf and Kubernetes: the CLI (:mod:`gym_services.commands.stack`) and the demo drive it
for a local stack, the operator (``gym_operator.handlers``) for pods. Each transaction reads as
its named steps:

checkpoint = the store's claim -> :meth:`~Coordinator.prepare_all` (by role, renewing leases; blockers
at the deadline fail it) -> :meth:`~Coordinator.capture_all` (controller first: its live episodes scope
the others) -> :meth:`~Coordinator.persist_all` (every participant's upload written, then verified by the
store) -> :meth:`~Coordinator.publish` (the global manifest, last, with a conditional put).
:meth:`~Coordinator.resume_all` (reverse role order) ends the pause right after the capture (``snapshot``,
the default) or after publishing (``sync``): the one difference between the two methods.

What is stored, and how, is the :class:`~gym_services.control.store.CheckpointStore`'s business: the
coordinator sequences the steps and calls it.

restore = :meth:`~Coordinator.read_checkpoint` -> :meth:`~Coordinator.match_participants` ->
:meth:`~Coordinator.restore_all` -> :meth:`~Coordinator.decide` (``resume`` written as the restore's
decision before anyone resumes) -> :meth:`~Coordinator.resume_all`.

Any failed step aborts every participant touched so far (:meth:`~Coordinator.abort_all`), so
nothing stays paused, no restore stays half installed, and no background upload of a checkpoint
that failed ever writes its participant manifest; a checkpoint that failed is recorded as failed in
the store, so its objects are reclaimed at once. Each step returns what it produced;
the result is built from those at the end, never mutated along the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

from gym_services.base.backoff import Backoff
from gym_services.base.config import StorageConfig
from gym_services.base.errors import ErrorCode
from gym_services.base.logs import get_logger
from gym_services.control.models import (
    SCHEMA_VERSION,
    CaptureRequest,
    CaptureResponse,
    CheckpointRef,
    GlobalManifest,
    ManifestParticipant,
    PersistResponse,
    PrepareRequest,
    Replica,
    RestoreRequest,
    RestoreResponse,
    RetireRequest,
    StatusResponse,
    StorageAccess,
)
from gym_services.control.participant import InvalidState
from gym_services.control.protocol import (
    DEFAULT_LEASE_S,
    DEFAULT_PREPARE_TIMEOUT_S,
    ROLE_ORDER,
    CheckpointMethod,
    Decision,
    Role,
    Verb,
)
from gym_services.control.storage import Storage, StorageError, open_storage
from gym_services.control.store import CheckpointRefused, CheckpointStore, Published
from gym_services.coordination.client import ControlClient, ParticipantError, ParticipantRef
from gym_services.coordination.deadlines import DEADLINES, Deadlines
from gym_services.coordination.transaction import (
    BlockerInfo,
    ParticipantSummary,
    TransactionKind,
    TransactionPhase,
    TransactionResult,
    TransactionStatus,
)

__all__ = [
    "BlockerInfo",
    "Coordinator",
    "ParticipantSummary",
    "TransactionCancelled",
    "TransactionError",
    "TransactionPhase",
    "TransactionResult",
    "by_role",
    "list_checkpoints",
]

log = get_logger("coordinator")
EventSink = Callable[[TransactionPhase, dict[str, Any]], Awaitable[None] | None]
A = TypeVar("A", bound=BaseModel)
A_ = TypeVar("A_")

# how long an abort asks again a participant that refuses it while its restore or capture still runs (the
# coordinator may have stopped waiting for that call, on a cancel); after that, the participant's lease reopens it
ABORT_BUSY_PATIENCE_S = 5.0


class TransactionError(Exception):
    """A step could not complete; the participants touched so far are aborted."""

    def __init__(self, message: str, blockers: Iterable[BlockerInfo] = ()) -> None:
        super().__init__(message)
        self.blockers = list(blockers)


class TransactionCancelled(TransactionError):
    """The transaction was cancelled from outside (on Kubernetes: its resource was deleted).

    A checkpoint is cancellable until it publishes, a restore until its decision is written; the
    participants touched so far are aborted at once, so none waits for its lease.
    """

    def __init__(self) -> None:
        super().__init__("cancelled before it completed; every participant touched was aborted")


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


@dataclass
class Stopwatch:
    """Seconds per step, in the order the steps ran."""

    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = time.perf_counter() - t0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


@dataclass
class TransactionProgress:
    """The phase a transaction reached; entering one is reported to the event sink."""

    coordinator: Coordinator
    checkpoint_id: str
    phase: TransactionPhase = TransactionPhase.PENDING

    async def enter(self, phase: TransactionPhase, **detail: Any) -> None:
        self.phase = phase
        await self.report(phase, **detail)

    async def report(self, phase: TransactionPhase, **detail: Any) -> None:
        await self.coordinator._emit(phase, checkpoint_id=self.checkpoint_id, **detail)


@dataclass(frozen=True)
class Snapshots:
    """What :meth:`Coordinator.capture_all` got back: every participant's capture and the episodes in scope."""

    answers: dict[str, CaptureResponse]
    episodes: list[str] | None


@dataclass(frozen=True)
class PersistedManifests:
    """What :meth:`Coordinator.persist_all` got back and verified: every participant manifest, the episodes in scope."""

    answers: dict[str, PersistResponse]
    episodes: list[str] | None


@dataclass
class _Checkpoint:
    """One checkpoint transaction as it runs: what it is, where it is stored, how far it got, its clock."""

    checkpoint_id: str
    location: str
    transaction_id: str
    store: CheckpointStore
    progress: TransactionProgress
    clock: Stopwatch = field(default_factory=Stopwatch)
    publish_by: float = float("inf")


class Coordinator:
    def __init__(
        self,
        participants: Iterable[ParticipantRef],
        client: ControlClient,
        *,
        storage_config: StorageConfig | None = None,
        participant_storage: StorageAccess | None = None,
        on_event: EventSink | None = None,
        deadlines: Deadlines = DEADLINES,
    ) -> None:
        """``storage_config`` is how the coordinator reaches storage; ``participant_storage``, when
        given, travels with capture and restore so servers reach it the same way instead of by their
        own storage config (a Checkpoint naming its own endpoint or credentials)."""
        self.participants = list(participants)
        ids = [p.participant_id for p in self.participants]
        if len(set(ids)) != len(ids):
            raise ValueError(f"participant ids must be unique: {ids}")
        self.client = client
        self.storage_config = storage_config or StorageConfig()
        self.participant_storage = participant_storage
        self.on_event = on_event
        self.deadlines = deadlines

    # --- plumbing -----------------------------------------------------------------

    async def _emit(self, phase: TransactionPhase, **detail: Any) -> None:
        """Tell the event sink; a sink that fails is logged and never changes the transaction's course."""
        log.info(phase, extra=detail)
        if self.on_event is not None:
            try:
                result = self.on_event(phase, detail)
                if asyncio.iscoroutine(result):
                    await result
            except Exception as exc:
                log.warning(f"event sink failed on {phase}: {type(exc).__name__}: {exc}", extra={"phase": phase})

    async def _unless_cancelled(self, work: Awaitable[A_], cancel: asyncio.Event | None) -> A_:
        """Run ``work``; if ``cancel`` is set first, stop it and raise :class:`TransactionCancelled`."""
        if cancel is None:
            return await work
        task = asyncio.ensure_future(work)
        waiter = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise TransactionCancelled()
        return task.result()

    @staticmethod
    def _check_cancelled(cancel: asyncio.Event | None) -> None:
        if cancel is not None and cancel.is_set():
            raise TransactionCancelled()

    def _storage(self, location: str) -> Storage:
        return open_storage(location, self.storage_config)

    def _store(self, location: str) -> CheckpointStore:
        return CheckpointStore(self._storage(location))

    async def _each(
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

    async def _all(
        self, refs: list[ParticipantRef], verb: Verb, call: Callable[[ParticipantRef], Awaitable[A]]
    ) -> dict[str, A]:
        """Like :meth:`_each`, but any failure fails the step."""
        ok, failed = await self._each(refs, verb, call)
        if failed:
            raise TransactionError("; ".join(str(e) for e in failed.values()))
        return ok

    @contextlib.asynccontextmanager
    async def _leases(self, checkpoint_id: str, lease_s: float) -> AsyncIterator[list[ParticipantRef]]:
        """Renew the lease of every touched participant while the transaction runs."""
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

    async def _finish_all(self, verb: Verb, checkpoint_id: str, refs: list[ParticipantRef]) -> list[str]:
        """Resume or abort in reverse role order; returns warnings for participants that failed."""
        req = CheckpointRef(checkpoint_id=checkpoint_id)
        finish = self.client.resume if verb is Verb.RESUME else self.client.abort
        warnings: list[str] = []
        for group in reversed(by_role(refs)):
            _, failed = await self._each(group, verb, lambda r: finish(r, req))
            busy = Backoff(first_s=0.05, max_s=0.5, deadline_s=ABORT_BUSY_PATIENCE_S)
            while verb is Verb.ABORT and (
                waiting := [e.ref for e in failed.values() if e.code == ErrorCode.CHECKPOINT_BUSY]
            ):
                # a restore or capture still running there (the coordinator stopped waiting for it, e.g. on a
                # cancel) refuses abort until it ends: ask again for a few seconds, then leave it to its lease
                if not busy.failed():
                    break
                await asyncio.sleep(busy.wait_s())
                _, again = await self._each(waiting, verb, lambda r: finish(r, req))
                failed = {pid: err for pid, err in failed.items() if pid not in {r.participant_id for r in waiting}}
                failed.update(again)
            for err in failed.values():
                if err.code == ErrorCode.UNKNOWN_CHECKPOINT:
                    continue  # already closed (lease expiry, or it never got the checkpoint)
                warnings.append(f"{err} (its lease will reopen it)")
        return warnings

    async def resume_all(self, checkpoint_id: str, refs: list[ParticipantRef]) -> list[str]:
        """Resume every participant, in reverse role order; warnings for those that did not answer."""
        return await self._finish_all(Verb.RESUME, checkpoint_id, refs)

    async def abort_all(self, checkpoint_id: str, refs: list[ParticipantRef]) -> list[str]:
        """Abort every participant touched so far, in reverse role order (nothing stays paused or installed)."""
        return await self._finish_all(Verb.ABORT, checkpoint_id, refs)

    # --- checkpoint ----------------------------------------------------------------

    async def checkpoint(
        self,
        checkpoint_id: str,
        location: str,
        *,
        prepare_timeout_s: float = DEFAULT_PREPARE_TIMEOUT_S,
        lease_s: float = DEFAULT_LEASE_S,
        transaction_id: str | None = None,
        claimed_by: str = "coordinator",
        method: CheckpointMethod = CheckpointMethod.SNAPSHOT,
        cancel: asyncio.Event | None = None,
    ) -> TransactionResult:
        """Claim the id, then prepare -> capture -> persist -> publish, resuming after the capture
        (``snapshot``, the default: the pause ends there) or after publishing (``sync``). Any failure
        aborts every participant touched and, when nothing can have been published, records the
        failure in the store (its objects are reclaimed at once).

        ``transaction_id`` names this transaction (the Checkpoint resource's uid on Kubernetes; a
        fresh one otherwise). A checkpoint id names one transaction: the same transaction run again
        carries on (or is answered from its manifest once published); another transaction under an
        existing id is refused before anything is paused (:meth:`CheckpointStore.claim`).

        ``cancel``, when set before the checkpoint is published, ends it as failed (:class:`TransactionCancelled`):
        a prepare still waiting for boundaries is interrupted, a capture is let finish first (a
        participant refuses abort while it captures); once published, it completes.
        """
        transaction_id = transaction_id or uuid.uuid4().hex
        run = _Checkpoint(
            checkpoint_id, location, transaction_id, self._store(location), TransactionProgress(self, checkpoint_id)
        )
        try:
            check_replica_sets(self.participants)  # before the id is claimed: a missing replica is no transaction
            existing, run.publish_by = await asyncio.to_thread(
                run.store.claim,
                checkpoint_id,
                transaction_id,
                claimed_by,
                [p.participant_id for p in self.participants],
            )
        except (TransactionError, CheckpointRefused, StorageError, InvalidState) as exc:
            await run.progress.report(TransactionPhase.FAILED, error=str(exc))
            return self._failed(
                TransactionKind.CHECKPOINT,
                checkpoint_id,
                location,
                run.progress.phase,
                str(exc),
                transaction_id=transaction_id,
            )
        if existing is not None:
            return self._from_manifest(checkpoint_id, location, existing, "already published; nothing to do")
        run.clock = Stopwatch()  # the pause starts with the first prepare, not with the claim's storage requests
        sync = CheckpointMethod(method) is CheckpointMethod.SYNC
        published: Published | None = None
        async with self._leases(checkpoint_id, lease_s) as touched:
            try:
                self._check_cancelled(cancel)
                await self._unless_cancelled(self.prepare_all(run, prepare_timeout_s, lease_s, touched), cancel)
                self._check_cancelled(cancel)
                captured = await self.capture_all(run)
                if sync:  # persisted and published while every rollout waits
                    persisted = await self.persist_all(run, captured)
                    published = await self.publish(run, persisted, CheckpointMethod.SYNC, cancel)
            except (TransactionError, CheckpointRefused, StorageError, InvalidState) as exc:
                warnings = await self._abort(checkpoint_id, touched, str(exc), run.progress)
                run.clock.timings["pause"] = run.clock.elapsed()
                return await self._checkpoint_failed(run, exc, warnings)
            await run.progress.enter(TransactionPhase.RESUMING)
            with run.clock.step("resume"):
                warnings = await self.resume_all(checkpoint_id, self.participants)
            touched.clear()  # resumed: nobody holds a lease for this checkpoint any more
        pause_s = run.clock.timings["pause"] = run.clock.elapsed()
        if published is None:
            try:
                persisted = await self.persist_all(run, captured)
                published = await self.publish(run, persisted, CheckpointMethod.SNAPSHOT, cancel)
            except (TransactionError, CheckpointRefused, StorageError, InvalidState) as exc:
                # already resumed: abandon every background upload, so no participant manifest appears later
                await run.progress.report(TransactionPhase.ABORTING, error=str(exc))
                warnings += await self.abort_all(checkpoint_id, self.participants)
                return await self._checkpoint_failed(run, exc, warnings)
            run.clock.timings["published"] = run.clock.elapsed()
        else:
            run.clock.timings["published"] = pause_s - run.clock.timings["resume"]
        result = self._checkpointed(run, persisted, published, warnings)
        await run.progress.enter(TransactionPhase.COMPLETED, pause_s=round(pause_s, 4), bytes=result.bytes)
        return result

    async def _checkpoint_failed(self, run: _Checkpoint, exc: Exception, warnings: list[str]) -> TransactionResult:
        """Every participant touched is aborted: record the failure (unless the global manifest may have
        been written: a storage error while publishing) and report Failed."""
        if not (isinstance(exc, StorageError) and run.progress.phase is TransactionPhase.PUBLISHING):
            try:
                await asyncio.to_thread(
                    run.store.record_failure, run.checkpoint_id, run.transaction_id, str(exc), "coordinator"
                )
            except (StorageError, InvalidState) as err:
                warnings = [
                    *warnings,
                    f"the failure could not be recorded ({err}); `gymckpt checkpoints prune` "
                    "reclaims its objects once its claim expires",
                ]
        await run.progress.report(TransactionPhase.FAILED, error=str(exc))
        return self._failed(
            TransactionKind.CHECKPOINT,
            run.checkpoint_id,
            run.location,
            run.progress.phase,
            str(exc),
            blockers=getattr(exc, "blockers", []),
            timings=run.clock.timings,
            warnings=warnings,
            transaction_id=run.transaction_id,
        )

    async def prepare_all(
        self, run: _Checkpoint, prepare_timeout_s: float, lease_s: float, touched: list[ParticipantRef]
    ) -> None:
        """Prepare role by role within one deadline; blockers at the deadline fail the checkpoint."""
        deadline = time.monotonic() + prepare_timeout_s
        await run.progress.enter(TransactionPhase.PREPARING, participants=len(self.participants))
        with run.clock.step("prepare"):
            for group in by_role(self.participants):
                touched.extend(group)
                remaining = self.deadlines.prepare_remaining(deadline)
                req = PrepareRequest(checkpoint_id=run.checkpoint_id, deadline_s=remaining, lease_s=lease_s)
                timeout = self.deadlines.prepare_call(remaining)
                ok, failed = await self._each(
                    group, Verb.PREPARE, functools.partial(self.client.prepare, req=req, timeout_s=timeout)
                )
                blockers = [
                    BlockerInfo(participant=pid, **b.model_dump())
                    for pid, answer in ok.items()
                    for b in answer.blockers
                ]
                if failed:
                    raise TransactionError("; ".join(str(e) for e in failed.values()), blockers)
                if blockers:
                    names = ", ".join(sorted({b.participant for b in blockers}))
                    raise TransactionError(
                        f"{len(blockers)} blockers at the prepare deadline ({prepare_timeout_s}s) on {names}", blockers
                    )

    async def capture_all(self, run: _Checkpoint) -> Snapshots:
        """Under the pause: every participant snapshots its scope (controller first: its episodes are the scope)."""
        await run.progress.enter(TransactionPhase.CAPTURING)
        storage = self.participant_storage
        with run.clock.step("capture"):
            controllers = [p for p in self.participants if p.role == Role.CONTROLLER]
            others = [p for p in self.participants if p.role != Role.CONTROLLER]
            answers: dict[str, CaptureResponse] = {}
            episodes: list[str] | None = None
            if controllers:
                req = CaptureRequest(checkpoint_id=run.checkpoint_id, location=run.location, storage=storage)
                answers.update(await self._all(controllers, Verb.CAPTURE, lambda r: self.client.capture(r, req)))
                episodes = sorted({e for answer in answers.values() for e in answer.episodes})
            if others:
                req = CaptureRequest(
                    checkpoint_id=run.checkpoint_id, location=run.location, episodes=episodes, storage=storage
                )
                answers.update(await self._all(others, Verb.CAPTURE, lambda r: self.client.capture(r, req)))
        return Snapshots(answers, episodes)

    async def persist_all(self, run: _Checkpoint, captured: Snapshots) -> PersistedManifests:
        """Every participant writes what it captured; each manifest is then verified in the store."""
        records = sum(a.records for a in captured.answers.values())
        await run.progress.enter(
            TransactionPhase.PERSISTING, records=records, pause_s=round(run.clock.timings.get("pause", 0), 4)
        )
        req = CheckpointRef(checkpoint_id=run.checkpoint_id)
        timeout = self.deadlines.persist_call(records)
        with run.clock.step("persist"):
            answers = await self._all(
                self.participants, Verb.PERSIST, lambda r: self.client.persist(r, req, timeout_s=timeout)
            )
        for pid, answer in answers.items():
            if answer.records != captured.answers[pid].records:
                raise TransactionError(
                    f"participant {pid} persisted {answer.records} records but captured {captured.answers[pid].records}"
                )
        with run.clock.step("verify"):
            await asyncio.gather(
                *(
                    asyncio.to_thread(run.store.verify_persisted, run.checkpoint_id, pid, answer)
                    for pid, answer in answers.items()
                )
            )
        return PersistedManifests(answers, captured.episodes)

    async def publish(
        self, run: _Checkpoint, persisted: PersistedManifests, method: CheckpointMethod, cancel: asyncio.Event | None
    ) -> Published:
        """The global manifest, written last by the store (only if absent, and not after the claim's bound)."""
        self._check_cancelled(cancel)
        await run.progress.enter(TransactionPhase.PUBLISHING)
        with run.clock.step("publish"):
            answers = persisted.answers
            manifest = GlobalManifest(
                schema_version=SCHEMA_VERSION,
                checkpoint_id=run.checkpoint_id,
                transaction_id=run.transaction_id,
                created_at=time.time(),
                participants=[
                    ManifestParticipant(
                        participant_id=p.participant_id,
                        role=p.role,
                        replica=p.replica,
                        manifest_key=answers[p.participant_id].manifest_key,
                        manifest_sha256=answers[p.participant_id].manifest_sha256,
                        manifest_size=answers[p.participant_id].manifest_size,
                        records=answers[p.participant_id].records,
                        bytes=answers[p.participant_id].bytes,
                        objects=answers[p.participant_id].objects,
                        written_bytes=answers[p.participant_id].written_bytes,
                        reused=answers[p.participant_id].reused,
                    )
                    for p in self.participants
                ],
                episodes=persisted.episodes,
                timings={k: round(v, 6) for k, v in run.clock.timings.items()},
                bytes=sum(a.bytes for a in answers.values()),
                method=method,
                references=sorted({r for a in answers.values() for r in a.references} - {run.checkpoint_id}),
            )
            return await asyncio.to_thread(run.store.publish, manifest, run.publish_by)

    async def _abort(
        self, checkpoint_id: str, touched: list[ParticipantRef], error: str, progress: TransactionProgress
    ) -> list[str]:
        await progress.report(TransactionPhase.ABORTING, error=error)
        return await self.abort_all(checkpoint_id, touched)

    def _checkpointed(
        self, run: _Checkpoint, persisted: PersistedManifests, published: Published, warnings: list[str]
    ) -> TransactionResult:
        answers = persisted.answers
        timings = run.clock.timings
        participants = [
            ParticipantSummary(
                participant_id=p.participant_id,
                role=p.role,
                records=answers[p.participant_id].records,
                bytes=answers[p.participant_id].bytes,
                manifest_key=answers[p.participant_id].manifest_key,
                episodes=len(answers[p.participant_id].episodes),
                replica=p.replica,
            )
            for p in self.participants
        ]
        return TransactionResult(
            kind=TransactionKind.CHECKPOINT,
            checkpoint_id=run.checkpoint_id,
            location=run.location,
            status=TransactionStatus.COMPLETED,
            phase=TransactionPhase.COMPLETED,
            participants=participants,
            timings=timings,
            pause_s=timings["pause"],
            published_s=timings.get("published"),
            method=published.manifest.method,
            records=sum(p.records for p in participants),
            bytes=sum(p.bytes for p in participants),
            objects=sum(a.objects for a in answers.values()) + 1,  # and the global manifest
            written_bytes=sum(a.written_bytes for a in answers.values()) + published.size,
            reused=sum(a.reused for a in answers.values()),
            episodes={e: 0 for e in persisted.episodes or []},
            manifest_key=published.key,
            transaction_id=published.manifest.transaction_id,
            warnings=warnings,
        )

    def _failed(
        self,
        kind: TransactionKind,
        checkpoint_id: str,
        location: str,
        phase: TransactionPhase,
        error: str,
        *,
        blockers: list[BlockerInfo] | None = None,
        timings: dict[str, float] | None = None,
        warnings: list[str] | None = None,
        restore_id: str | None = None,
        transaction_id: str | None = None,
    ) -> TransactionResult:
        timings = dict(timings or {})
        return TransactionResult(
            kind=kind,
            checkpoint_id=checkpoint_id,
            location=location,
            status=TransactionStatus.FAILED,
            phase=phase,
            blockers=blockers or [],
            timings=timings,
            pause_s=timings.get("pause", 0.0),
            restore_id=restore_id,
            transaction_id=transaction_id,
            error=error,
            warnings=warnings or [],
        )

    def _from_manifest(
        self, checkpoint_id: str, location: str, manifest: GlobalManifest, note: str
    ) -> TransactionResult:
        return TransactionResult(
            kind=TransactionKind.CHECKPOINT,
            checkpoint_id=checkpoint_id,
            location=location,
            status=TransactionStatus.COMPLETED,
            phase=TransactionPhase.COMPLETED,
            manifest_key=CheckpointStore.manifest_key(manifest.checkpoint_id),
            participants=[
                ParticipantSummary(
                    participant_id=p.participant_id,
                    role=p.role,
                    records=p.records,
                    bytes=p.bytes,
                    manifest_key=p.manifest_key,
                    replica=p.replica,
                )
                for p in manifest.participants
            ],
            records=sum(p.records for p in manifest.participants),
            bytes=manifest.bytes,
            timings=dict(manifest.timings),
            pause_s=manifest.timings.get("pause", 0.0),
            episodes={e: 0 for e in manifest.episodes or []},
            transaction_id=manifest.transaction_id,
            warnings=[note],
        )

    # --- restore -------------------------------------------------------------------

    async def restore(
        self,
        checkpoint_id: str,
        location: str,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        restore_id: str | None = None,
        cancel: asyncio.Event | None = None,
    ) -> TransactionResult:
        """Restore every participant, decide, resume; all or nothing.

        ``restore_id`` names the transaction (the Restore resource's uid on Kubernetes, so an
        operator restarted mid-restore repeats the same one; a fresh id otherwise). Once every
        participant has restored, ``resume`` is written as the restore's decision before anyone
        resumes: participants whose lease runs out follow that object, so a coordinator dying
        between two resumes still leaves the restore installed everywhere, and one dying before
        it leaves it installed nowhere. ``cancel``, when set before the decision is written, ends it
        as failed and undoes it everywhere (:class:`TransactionCancelled`); once decided, it completes.
        """
        restore_id = restore_id or uuid.uuid4().hex
        clock = Stopwatch()
        store = self._store(location)
        progress = TransactionProgress(self, checkpoint_id)

        def refused(error: str) -> TransactionResult:
            return self._failed(
                TransactionKind.RESTORE, checkpoint_id, location, progress.phase, error, restore_id=restore_id
            )

        try:
            manifest = await self.read_checkpoint(store, checkpoint_id, restore_id)
            refs = self.match_participants(checkpoint_id, manifest)
        except (TransactionError, StorageError, InvalidState) as exc:
            return refused(str(exc))
        entries = {p.participant_id: p for p in manifest.participants}
        async with self._leases(checkpoint_id, lease_s) as touched:
            touched.extend(refs)
            try:
                self._check_cancelled(cancel)
                restored = await self._unless_cancelled(  # a participant still restoring is aborted, not waited for
                    self.restore_all(checkpoint_id, location, restore_id, lease_s, refs, entries, progress, clock),
                    cancel,
                )
                self._check_cancelled(cancel)
                await self.decide(store, checkpoint_id, restore_id)
            except TransactionError as exc:
                warnings = await self._abort(checkpoint_id, refs, str(exc), progress)
                await progress.report(TransactionPhase.FAILED, error=str(exc))
                return self._failed(
                    TransactionKind.RESTORE,
                    checkpoint_id,
                    location,
                    progress.phase,
                    str(exc),
                    timings=clock.timings,
                    warnings=warnings,
                    restore_id=restore_id,
                )
            await progress.enter(TransactionPhase.RESUMING)
            with clock.step("resume"):
                warnings = await self.resume_all(checkpoint_id, refs)
        clock.timings["total"] = clock.elapsed()
        result = self._restored(checkpoint_id, location, restore_id, refs, entries, restored, clock.timings, warnings)
        await progress.enter(TransactionPhase.COMPLETED, records=result.records)
        return result

    async def read_checkpoint(self, store: CheckpointStore, checkpoint_id: str, restore_id: str) -> GlobalManifest:
        """The published manifest, refusing a restore that was abandoned earlier or a checkpoint never published."""
        try:
            manifest = await asyncio.to_thread(store.published, checkpoint_id)
            earlier = await asyncio.to_thread(store.decision, checkpoint_id, restore_id)
        except (StorageError, InvalidState) as exc:
            raise TransactionError(f"cannot read checkpoint {checkpoint_id}: {exc}") from None
        if earlier == Decision.ABORT:
            raise TransactionError(
                f"restore {restore_id} of checkpoint {checkpoint_id} was abandoned earlier "
                "(a participant's lease ran out before it was decided) and undone everywhere; start a new restore"
            )
        if manifest is None:
            raise TransactionError(
                f"checkpoint {checkpoint_id} has no manifest at {store.url}/{store.manifest_key(checkpoint_id)}: "
                "it is unknown or incomplete and is never restored"
            )
        return manifest

    def match_participants(self, checkpoint_id: str, manifest: GlobalManifest) -> list[ParticipantRef]:
        """The current participant for each one in the checkpoint (same id, same role, same replica), in
        manifest order; a replicated server must run as many replicas as it did at the checkpoint."""
        check_replica_sets(self.participants)
        # a checkpoint written before replicas were recorded names none: its participants match by id alone
        recorded = [p for p in manifest.participants if p.replica is not None]
        then = replica_counts(recorded)
        now = replica_counts(self.participants)
        differ = sorted(g for g in then if now.get(g, 0) != then[g])
        if differ:
            counts = "; ".join(f"{g}: {then[g]} in the checkpoint, {now.get(g, 0)} here" for g in differ)
            raise TransactionError(
                f"checkpoint {checkpoint_id} was taken with other replica counts ({counts}). Each replica's sessions "
                "and episodes are restored into the replica of the same ordinal, so the counts must match: run the "
                "stack with the checkpoint's replica counts (replicas: in the stack YAML, servers[].replicas in the "
                "chart's values) and restore again"
            )
        current = {p.participant_id: p for p in self.participants}

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

    async def restore_all(
        self,
        checkpoint_id: str,
        location: str,
        restore_id: str,
        lease_s: float,
        refs: list[ParticipantRef],
        entries: dict[str, ManifestParticipant],
        progress: TransactionProgress,
        clock: Stopwatch,
    ) -> dict[str, RestoreResponse]:
        """Every participant reads, verifies and installs its records (each one validates all before installing any)."""
        await progress.enter(TransactionPhase.RESTORING, participants=len(refs))

        def request(ref: ParticipantRef) -> RestoreRequest:
            entry = entries[ref.participant_id]
            return RestoreRequest(
                checkpoint_id=checkpoint_id,
                location=location,
                manifest_key=entry.manifest_key,
                manifest_sha256=entry.manifest_sha256,
                lease_s=lease_s,
                restore_id=restore_id,
                storage=self.participant_storage,
            )

        timeout = self.deadlines.restore_call(lease_s)
        with clock.step("restore"):
            return await self._all(refs, Verb.RESTORE, lambda r: self.client.restore(r, request(r), timeout_s=timeout))

    async def decide(self, store: CheckpointStore, checkpoint_id: str, restore_id: str) -> None:
        """Write ``resume`` as the restore's decision; fails when it does not hold (a lease ran out first)."""
        decision: Decision | None
        try:
            decision = await asyncio.to_thread(store.settle, checkpoint_id, restore_id, Decision.RESUME, "coordinator")
        except (StorageError, InvalidState) as exc:
            try:  # the put may have landed before the error: the object says what holds
                decision = await asyncio.to_thread(store.decision, checkpoint_id, restore_id)
            except (StorageError, InvalidState):
                decision = None
            if decision is None:
                raise TransactionError(f"cannot write the decision of restore {restore_id}: {exc}") from None
        if decision == Decision.ABORT:
            raise TransactionError(
                f"a participant's lease ran out before restore {restore_id} was decided; it is undone everywhere"
            )

    def _restored(
        self,
        checkpoint_id: str,
        location: str,
        restore_id: str,
        refs: list[ParticipantRef],
        entries: dict[str, ManifestParticipant],
        answers: dict[str, RestoreResponse],
        timings: dict[str, float],
        warnings: list[str],
    ) -> TransactionResult:
        participants = [
            ParticipantSummary(
                participant_id=ref.participant_id,
                role=ref.role,
                records=answers[ref.participant_id].records,
                bytes=answers[ref.participant_id].bytes,
                manifest_key=entries[ref.participant_id].manifest_key,
                episodes=len(answers[ref.participant_id].episodes),
                replica=ref.replica,
            )
            for ref in refs
        ]
        episodes: dict[str, int] = {}
        for ref in refs:
            for rollout, attempt in answers[ref.participant_id].episodes.items():
                episodes[rollout] = max(episodes.get(rollout, 0), attempt)
        return TransactionResult(
            kind=TransactionKind.RESTORE,
            checkpoint_id=checkpoint_id,
            location=location,
            status=TransactionStatus.COMPLETED,
            phase=TransactionPhase.COMPLETED,
            participants=participants,
            timings=timings,
            pause_s=timings["total"],
            records=sum(p.records for p in participants),
            bytes=sum(p.bytes for p in participants),
            episodes=episodes,
            manifest_key=CheckpointStore.manifest_key(checkpoint_id),
            restore_id=restore_id,
            warnings=warnings,
        )

    # --- retire and status -----------------------------------------------------------

    async def retire(self, rollout_id: str, attempt: int) -> dict[str, bool]:
        """Drop one attempt: environment, then agent, then model and resources together."""
        order: list[tuple[Role, ...]] = [
            (Role.ENVIRONMENT,),
            (Role.AGENT,),
            (Role.MODEL, Role.RESOURCES),
            (Role.CONTROLLER,),
        ]
        req = RetireRequest(rollout_id=rollout_id, attempt=attempt)
        dropped: dict[str, bool] = {}
        for roles in order:
            group = [p for p in self.participants if p.role in roles]
            if group:
                ok = await self._all(group, Verb.RETIRE, lambda r: self.client.retire(r, req))
                dropped.update({pid: a.retired for pid, a in ok.items()})
        return dropped

    async def status(self) -> dict[str, StatusResponse | ParticipantError]:
        """Every participant's status, or why it could not be read."""
        ok, failed = await self._each(self.participants, Verb.STATUS, lambda r: self.client.status(r))
        return {p.participant_id: ok.get(p.participant_id) or failed[p.participant_id] for p in self.participants}


def list_checkpoints(
    location: str, storage_config: StorageConfig | None = None
) -> list[tuple[str, GlobalManifest | None]]:
    """Checkpoint ids at a location with their manifest (None when incomplete)."""
    return CheckpointStore(open_storage(location, storage_config)).checkpoints()
