"""The checkpoint transaction (``docs/protocol.md``, "Transactions"): one object per checkpoint taken.

:meth:`CheckpointTransaction.run` reads as its named steps:

the store's claim (:meth:`~CheckpointTransaction.claim`) -> :meth:`~CheckpointTransaction.prepare_all` (by role,
pause leases renewed; blockers at the deadline fail it) -> :meth:`~CheckpointTransaction.capture_all` (controller
first: its live episodes scope the others) -> :meth:`~CheckpointTransaction.persist_all` (every participant's upload
written, then verified by the store) -> :meth:`~CheckpointTransaction.publish` (the global manifest, last, with a
conditional put). The participants are resumed (the servers agents call first) right after the capture with the
default method, or after publishing with ``sync``: the one difference between the two methods. A *final* checkpoint
(the one a termination takes: ``docs/protocol.md``, "Termination") is written like ``sync`` and never resumed: its
participants hold it until their processes exit, and the stack continues from it in fresh ones.

Any failed step aborts every participant touched so far, so nothing stays paused and no background upload of a
checkpoint that failed ever writes its participant manifest; the failure is recorded in the store, so its objects
are reclaimed at once. What is stored, and how, is the :class:`~gym_services.control.store.CheckpointStore`'s
business: the transaction sequences the steps and calls it.

When the transaction stops waiting is its :class:`~gym_services.coordination.transaction.Cancellation`'s business,
consulted before each step that may still be undone and raced against the prepare (the one step that waits on
the rollouts); once the global manifest is published nothing stops it. The claim bounds when the manifest may
still be published (``publish_by``), so a checkpoint that runs out of time publishes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from dataclasses import dataclass

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
    PrepareResponse,
)
from gym_services.control.participant import InvalidState
from gym_services.control.protocol import CheckpointMethod, Role, Verb
from gym_services.control.storage import StorageError
from gym_services.control.storage.gateway import GrantIssuer
from gym_services.control.store import CheckpointRefused, CheckpointStore, Published
from gym_services.coordination.client import ParticipantRef
from gym_services.coordination.participants import ParticipantSet
from gym_services.coordination.results import Outcome, Progress, Stopwatch
from gym_services.coordination.transaction import (
    BlockerInfo,
    Cancellation,
    TransactionError,
    TransactionPhase,
    TransactionResult,
)

log = get_logger("coordinator")

#: what ends a checkpoint as failed (anything else is a bug and propagates)
FAILURES = (TransactionError, CheckpointRefused, StorageError, InvalidState)


@dataclass(frozen=True)
class Captured:
    """What :meth:`CheckpointTransaction.capture_all` got back: every participant's capture and the episodes in
    scope (None when no controller names them)."""

    answers: dict[str, CaptureResponse]
    episodes: list[str] | None


@dataclass(frozen=True)
class Persisted:
    """What :meth:`CheckpointTransaction.persist_all` got back and verified: every participant manifest, the
    episodes in scope."""

    answers: dict[str, PersistResponse]
    episodes: list[str] | None


class CheckpointTransaction:
    """One checkpoint of a participant set: claim, prepare, capture, persist, publish; all or nothing.

    ``progress`` names it (checkpoint id, location, transaction id) and reports its phases;
    ``grants``, when given, issue each participant's storage grant, sent with its capture (the servers then write
    through the storage gateway)."""

    def __init__(
        self,
        participants: ParticipantSet,
        store: CheckpointStore,
        progress: Progress,
        *,
        prepare_timeout_s: float,
        lease_s: float,
        method: CheckpointMethod,
        claimed_by: str = "coordinator",
        cancellation: Cancellation | None = None,
        grants: GrantIssuer | None = None,
        final: bool = False,
    ) -> None:
        if progress.transaction_id is None:
            raise ValueError("a checkpoint transaction needs its transaction id")
        self.participants = participants
        self.store = store
        self.progress = progress
        self.checkpoint_id = progress.checkpoint_id
        self.transaction_id: str = progress.transaction_id
        self.prepare_timeout_s = prepare_timeout_s
        self.lease_s = lease_s
        self.final = final
        # a final checkpoint is never resumed: its records are written under the pause, as with ``sync``
        self.method = CheckpointMethod.SYNC if final else CheckpointMethod(method)
        self.claimed_by = claimed_by
        self.cancellation = cancellation or Cancellation()
        self.grants = grants
        self.publish_by = float("inf")  # set by the claim
        #: seconds each role took to prepare (also in the timings as ``prepare <role>``; the "Capturing" log line
        #: says where the pause went)
        self.prepare_s: dict[str, float] = {}

    @property
    def clock(self) -> Stopwatch:
        return self.progress.clock

    async def run(self) -> TransactionResult:
        """Claim the id, then prepare -> capture -> persist -> publish, resuming after the capture (or after
        publishing with ``sync``). The result says what was published, or why not."""
        try:
            existing = await self.claim()
        except FAILURES as exc:
            await self.progress.report(TransactionPhase.FAILED, error=str(exc))
            return self.progress.failed(str(exc))
        if existing is not None:
            return self.progress.completed(Outcome.published_earlier(existing), ["already published; nothing to do"])
        self.progress.clock = Stopwatch()  # the pause starts with the first prepare, not with the claim's requests
        async with self.participants.leases(self.checkpoint_id, self.lease_s) as touched:
            try:
                captured, written = await self.paused(touched)
            except FAILURES as exc:
                await self.progress.report(TransactionPhase.ABORTING, error=str(exc))
                warnings = await self.participants.abort(self.checkpoint_id, touched)
                self.clock.timings["pause"] = self.clock.elapsed()
                return await self.failed(exc, warnings)
            warnings = await self.resume_all()
            touched.clear()  # resumed (or final, held until exit): the leases are no longer renewed
        pause_s = self.clock.timings["pause"] = self.clock.elapsed()
        if written is None:
            try:
                persisted = await self.persist_all(captured)
                written = persisted, await self.publish(persisted)
            except FAILURES as exc:
                # already resumed: abandon every background upload, so no participant manifest appears later
                await self.progress.report(TransactionPhase.ABORTING, error=str(exc))
                warnings += await self.participants.abort(self.checkpoint_id, self.participants.refs)
                return await self.failed(exc, warnings)
            self.clock.timings["published"] = self.clock.elapsed()
        else:
            self.clock.timings["published"] = pause_s - self.clock.timings.get("resume", 0.0)
        persisted, published = written
        outcome = Outcome.checkpointed(self.participants, persisted.answers, persisted.episodes, published)
        outcome = dataclasses.replace(outcome, final=self.final)
        result = self.progress.completed(outcome, warnings)
        await self.progress.enter(TransactionPhase.COMPLETED, pause_s=round(pause_s, 4), bytes=result.bytes)
        return result

    async def resume_all(self) -> list[str]:
        """Resume every participant (``REOPEN_ORDER``: the servers agents call first); a final checkpoint resumes
        nobody."""
        if self.final:
            return []
        await self.progress.enter(TransactionPhase.RESUMING)
        seconds: dict[str, float] = {}
        with self.clock.step("resume"):
            warnings = await self.participants.resume(self.checkpoint_id, self.participants.refs, seconds)
        self.clock.timings.update({f"resume {role}": s for role, s in seconds.items()})
        return warnings

    async def claim(self) -> GlobalManifest | None:
        """Claim the checkpoint id for this transaction before anything is paused; the manifest when this
        same transaction published it already. Refuses an incomplete replica set and another transaction's id."""
        self.participants.check_complete()  # before the id is claimed: a missing replica is no transaction
        existing, self.publish_by = await asyncio.to_thread(
            self.store.claim, self.checkpoint_id, self.transaction_id, self.claimed_by, self.participants.ids
        )
        return existing

    async def paused(self, touched: list[ParticipantRef]) -> tuple[Captured, tuple[Persisted, Published] | None]:
        """The steps under the pause: prepare and capture; with ``sync``, persist and publish too (then the
        second item says what was persisted and published)."""
        self.cancellation.check()
        await self.cancellation.guard(self.prepare_all(touched))
        self.cancellation.check()
        captured = await self.capture_all()
        if self.method is not CheckpointMethod.SYNC:
            return captured, None
        persisted = await self.persist_all(captured)  # persisted and published while every rollout waits
        return captured, (persisted, await self.publish(persisted))

    async def failed(self, exc: Exception, warnings: list[str]) -> TransactionResult:
        """Every participant touched is aborted: record the failure (unless the global manifest may have
        been written: a storage error while publishing) and report Failed."""
        if not (isinstance(exc, StorageError) and self.progress.phase is TransactionPhase.PUBLISHING):
            try:
                await asyncio.to_thread(
                    self.store.record_failure, self.checkpoint_id, self.transaction_id, str(exc), "coordinator"
                )
            except (StorageError, InvalidState) as err:
                warnings = [
                    *warnings,
                    f"the failure could not be recorded ({err}); `gymckpt checkpoints prune` "
                    "reclaims its objects once its claim expires",
                ]
        await self.progress.report(TransactionPhase.FAILED, error=str(exc))
        blockers = exc.blockers if isinstance(exc, TransactionError) else []
        return self.progress.failed(str(exc), blockers=blockers, warnings=warnings)

    # --- the steps ----------------------------------------------------------------------

    async def prepare_all(self, touched: list[ParticipantRef]) -> None:
        """Prepare role by role within one deadline; blockers at the deadline fail the checkpoint."""
        deadlines = self.participants.deadlines
        deadline = time.monotonic() + self.prepare_timeout_s
        await self.progress.enter(TransactionPhase.PREPARING, participants=len(self.participants))
        with self.clock.step("prepare"):
            for group in self.participants.in_role_order():
                touched.extend(group)
                remaining = deadlines.prepare_remaining(deadline)
                req = PrepareRequest(
                    checkpoint_id=self.checkpoint_id,
                    deadline_s=remaining,
                    lease_s=self.lease_s,
                    final=True if self.final else None,
                )
                call = functools.partial(
                    self.participants.client.prepare, req=req, timeout_s=deadlines.prepare_call(remaining)
                )
                started = time.monotonic()
                ok, failed = await self.participants.each(group, Verb.PREPARE, call)
                role, seconds = group[0].role, time.monotonic() - started
                self.prepare_s[role] = round(seconds, 4)
                self.clock.timings[f"prepare {role}"] = seconds
                # the longest a participant of the role waited for its boundary, of those seconds (the rest: the
                # call's way there and back, and its turn on the participant's event loop)
                self.clock.timings[f"prepare {role} waited"] = max((a.waited_s for a in ok.values()), default=0.0)
                self._final_if_held(ok)
                blockers = [
                    BlockerInfo(participant=pid, **b.model_dump())
                    for pid, answer in ok.items()
                    for b in answer.blockers
                ]
                if failed:
                    raise TransactionError("; ".join(str(e) for e in failed.values()), blockers)
                if blockers:
                    names = ", ".join(
                        sorted({b.participant + (f" (waiting on {b.server})" if b.server else "") for b in blockers})
                    )
                    raise TransactionError(
                        f"{len(blockers)} blockers at the prepare deadline ({self.prepare_timeout_s}s) on {names}",
                        blockers,
                    )

    def _final_if_held(self, answers: dict[str, PrepareResponse]) -> None:
        """A participant that holds the checkpoint as final (it was prepared after its termination signal) makes the
        whole checkpoint final: written under the pause and resumed nowhere, so no participant works past a cut
        another will not leave (``docs/protocol.md``, "Termination")."""
        held = sorted(pid for pid, answer in answers.items() if answer.final)
        if held and not self.final:
            self.final, self.method = True, CheckpointMethod.SYNC
            log.warning(
                "a participant holds the checkpoint as final: it is final for every participant",
                extra={"checkpoint_id": self.checkpoint_id, "participants": held},
            )

    async def capture_all(self) -> Captured:
        """Under the pause: every participant captures its scope (controller first: its episodes are the scope)."""
        await self.progress.enter(TransactionPhase.CAPTURING, prepare_s=self.prepare_s)
        client = self.participants.client
        with self.clock.step("capture"):
            controllers = [p for p in self.participants if p.role == Role.CONTROLLER]
            others = [p for p in self.participants if p.role != Role.CONTROLLER]
            answers: dict[str, CaptureResponse] = {}
            episodes: list[str] | None = None
            if controllers:
                answers.update(
                    await self.participants.all(
                        controllers, Verb.CAPTURE, lambda r: client.capture(r, self._capture_request(r, None))
                    )
                )
                episodes = sorted({e for answer in answers.values() for e in answer.episodes})
            if others:
                scope = episodes
                answers.update(
                    await self.participants.all(
                        others, Verb.CAPTURE, lambda r: client.capture(r, self._capture_request(r, scope))
                    )
                )
        return Captured(answers, episodes)

    def _capture_request(self, ref: ParticipantRef, episodes: list[str] | None) -> CaptureRequest:
        return CaptureRequest(
            checkpoint_id=self.checkpoint_id,
            location=self.progress.location,
            episodes=episodes,
            storage=self.grants.capture(self.checkpoint_id, ref.participant_id) if self.grants else None,
            final=True if self.final else None,
        )

    async def persist_all(self, captured: Captured) -> Persisted:
        """Every participant writes what it captured; each manifest is then verified in the store."""
        records = sum(a.records for a in captured.answers.values())
        await self.progress.enter(
            TransactionPhase.PERSISTING, records=records, pause_s=round(self.clock.timings.get("pause", 0), 4)
        )
        req = CheckpointRef(checkpoint_id=self.checkpoint_id)
        timeout = self.participants.deadlines.persist_call(records)
        client = self.participants.client
        with self.clock.step("persist"):
            answers = await self.participants.all(
                self.participants.refs, Verb.PERSIST, lambda r: client.persist(r, req, timeout_s=timeout)
            )
        for pid, answer in answers.items():
            if answer.records != captured.answers[pid].records:
                raise TransactionError(
                    f"participant {pid} persisted {answer.records} records but captured {captured.answers[pid].records}"
                )
        with self.clock.step("verify"):
            await asyncio.gather(
                *(
                    asyncio.to_thread(self.store.verify_persisted, self.checkpoint_id, pid, answer)
                    for pid, answer in answers.items()
                )
            )
        return Persisted(answers, captured.episodes)

    async def publish(self, persisted: Persisted) -> Published:
        """The global manifest, written last by the store (only if absent, and not after the claim's bound)."""
        self.cancellation.check()
        await self.progress.enter(TransactionPhase.PUBLISHING)
        with self.clock.step("publish"):
            manifest = self._manifest(persisted)
            return await asyncio.to_thread(self.store.publish, manifest, self.publish_by)

    def _manifest(self, persisted: Persisted) -> GlobalManifest:
        answers = persisted.answers
        return GlobalManifest(
            schema_version=SCHEMA_VERSION,
            checkpoint_id=self.checkpoint_id,
            transaction_id=self.transaction_id,
            created_at=time.time(),
            participants=[_entry(p, answers[p.participant_id]) for p in self.participants],
            episodes=persisted.episodes,
            timings={k: round(v, 6) for k, v in self.clock.timings.items()},
            bytes=sum(a.bytes for a in answers.values()),
            method=self.method,
            references=sorted({r for a in answers.values() for r in a.references} - {self.checkpoint_id}),
        )


def _entry(ref: ParticipantRef, answer: PersistResponse) -> ManifestParticipant:
    """One participant's line in the global manifest: who it is and what its persist wrote."""
    return ManifestParticipant(
        participant_id=ref.participant_id,
        role=ref.role,
        replica=ref.replica,
        manifest_key=answer.manifest_key,
        manifest_sha256=answer.manifest_sha256,
        manifest_size=answer.manifest_size,
        records=answer.records,
        bytes=answer.bytes,
        objects=answer.objects,
        written_bytes=answer.written_bytes,
        reused=answer.reused,
        scope=answer.scope,
    )
