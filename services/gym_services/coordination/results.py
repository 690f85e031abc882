"""How far a transaction got, and the one place its :class:`TransactionResult` is built.

A transaction (:mod:`~gym_services.coordination.checkpoint`, :mod:`~gym_services.coordination.restore`)
carries one :class:`Progress`: what it is (kind, checkpoint id, location, its transaction or restore
id), the phase it reached (each phase entered is told to the event sink) and its :class:`Stopwatch`.
When it ends it asks its progress for the result: :meth:`Progress.failed` with the error, or
:meth:`Progress.completed` with an :class:`Outcome` - what the participants answered, in the result's
terms, built from whichever answers the transaction holds (every participant's persist, a manifest
published earlier, every participant's restore). Both go through :meth:`Progress._result`, the only
call that makes a :class:`TransactionResult`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gym_services.base.logs import get_logger
from gym_services.control.models import GlobalManifest, ManifestParticipant, PersistResponse, RestoreResponse
from gym_services.control.protocol import CheckpointMethod
from gym_services.control.store import CheckpointStore, Published
from gym_services.coordination.client import ParticipantRef
from gym_services.coordination.transaction import (
    BlockerInfo,
    ParticipantSummary,
    TransactionKind,
    TransactionPhase,
    TransactionResult,
    TransactionStatus,
)

log = get_logger("coordinator")

#: told of every phase a transaction enters (and of failures), with details; may be a coroutine function
EventSink = Callable[[TransactionPhase, dict[str, Any]], Awaitable[None] | None]


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


@dataclass(frozen=True)
class Outcome:
    """What a completed transaction produced, per participant and in total; one constructor per source."""

    participants: list[ParticipantSummary]
    episodes: dict[str, int]
    manifest_key: str
    method: CheckpointMethod | None = None
    objects: int = 0
    written_bytes: int = 0
    reused: int = 0
    #: the timings of the transaction that did the work, when it was not this one
    timings: dict[str, float] | None = None
    #: a final checkpoint: never resumed (docs/protocol.md, Termination)
    final: bool = False

    @classmethod
    def checkpointed(
        cls,
        refs: Iterable[ParticipantRef],
        answers: dict[str, PersistResponse],
        episodes: list[str] | None,
        published: Published,
    ) -> Outcome:
        """A checkpoint this transaction persisted and published."""
        return cls(
            participants=[
                ParticipantSummary(
                    participant_id=ref.participant_id,
                    role=ref.role,
                    records=answers[ref.participant_id].records,
                    bytes=answers[ref.participant_id].bytes,
                    manifest_key=answers[ref.participant_id].manifest_key,
                    episodes=len(answers[ref.participant_id].episodes),
                    replica=ref.replica,
                    scope=answers[ref.participant_id].scope,
                )
                for ref in refs
            ],
            episodes={e: 0 for e in episodes or []},
            manifest_key=published.key,
            method=published.manifest.method,
            objects=sum(a.objects for a in answers.values()) + 1,  # and the global manifest
            written_bytes=sum(a.written_bytes for a in answers.values()) + published.size,
            reused=sum(a.reused for a in answers.values()),
        )

    @classmethod
    def published_earlier(cls, manifest: GlobalManifest) -> Outcome:
        """A checkpoint the same transaction had published already: nothing was written now."""
        return cls(
            participants=[_summary_of(p) for p in manifest.participants],
            episodes={e: 0 for e in manifest.episodes or []},
            manifest_key=CheckpointStore.manifest_key(manifest.checkpoint_id),
            timings=dict(manifest.timings),
        )

    @classmethod
    def restored(
        cls,
        checkpoint_id: str,
        refs: Iterable[ParticipantRef],
        entries: dict[str, ManifestParticipant],
        answers: dict[str, RestoreResponse],
    ) -> Outcome:
        """A restore every participant installed; each rollout continues at its highest next attempt."""
        refs = list(refs)
        episodes: dict[str, int] = {}
        for ref in refs:
            for rollout, attempt in answers[ref.participant_id].episodes.items():
                episodes[rollout] = max(episodes.get(rollout, 0), attempt)
        return cls(
            participants=[
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
            ],
            episodes=episodes,
            manifest_key=CheckpointStore.manifest_key(checkpoint_id),
        )


def _summary_of(p: ManifestParticipant) -> ParticipantSummary:
    return ParticipantSummary(
        participant_id=p.participant_id,
        role=p.role,
        records=p.records,
        bytes=p.bytes,
        manifest_key=p.manifest_key,
        replica=p.replica,
        scope=p.scope,
    )


@dataclass
class Progress:
    """One transaction as it runs: what it is, the phase it reached, its clock; it builds the result."""

    kind: TransactionKind
    checkpoint_id: str
    location: str
    sink: EventSink | None = None
    transaction_id: str | None = None  # checkpoints
    restore_id: str | None = None  # restores
    phase: TransactionPhase = TransactionPhase.PENDING
    clock: Stopwatch = field(default_factory=Stopwatch)

    async def enter(self, phase: TransactionPhase, **detail: Any) -> None:
        """Reach ``phase`` and tell the event sink."""
        self.phase = phase
        await self.report(phase, **detail)

    async def report(self, phase: TransactionPhase, **detail: Any) -> None:
        """Tell the event sink (and the log) of ``phase`` without reaching it (Aborting, Failed).

        A sink that fails is logged and never changes the transaction's course."""
        detail = {"checkpoint_id": self.checkpoint_id, **detail}
        log.info(phase, extra=detail)
        if self.sink is None:
            return
        try:
            result = self.sink(phase, detail)
            if asyncio.iscoroutine(result):
                await result
        except Exception as exc:
            log.warning(f"event sink failed on {phase}: {type(exc).__name__}: {exc}", extra={"phase": phase})

    def completed(self, outcome: Outcome, warnings: list[str]) -> TransactionResult:
        """The result of a transaction that completed with ``outcome``."""
        return self._result(TransactionStatus.COMPLETED, TransactionPhase.COMPLETED, outcome=outcome, warnings=warnings)

    def failed(
        self, error: str, *, blockers: Iterable[BlockerInfo] = (), warnings: Iterable[str] = ()
    ) -> TransactionResult:
        """The result of a transaction that failed in the phase it reached."""
        return self._result(TransactionStatus.FAILED, self.phase, error=error, blockers=blockers, warnings=warnings)

    def _result(
        self,
        status: TransactionStatus,
        phase: TransactionPhase,
        *,
        outcome: Outcome | None = None,
        error: str | None = None,
        blockers: Iterable[BlockerInfo] = (),
        warnings: Iterable[str] = (),
    ) -> TransactionResult:
        timings = dict(outcome.timings if outcome is not None and outcome.timings is not None else self.clock.timings)
        # a restore pauses its participants throughout (they are fresh, closed until it resumes them)
        pause_s = timings.get("total" if self.kind is TransactionKind.RESTORE else "pause", 0.0)
        participants = outcome.participants if outcome is not None else []
        return TransactionResult(
            kind=self.kind,
            checkpoint_id=self.checkpoint_id,
            location=self.location,
            status=status,
            phase=phase,
            participants=participants,
            blockers=list(blockers),
            timings=timings,
            pause_s=pause_s,
            published_s=timings.get("published"),
            method=outcome.method if outcome is not None else None,
            final=outcome.final if outcome is not None else False,
            records=sum(p.records for p in participants),
            bytes=sum(p.bytes for p in participants),
            objects=outcome.objects if outcome is not None else 0,
            written_bytes=outcome.written_bytes if outcome is not None else 0,
            reused=outcome.reused if outcome is not None else 0,
            episodes=dict(outcome.episodes) if outcome is not None else {},
            manifest_key=outcome.manifest_key if outcome is not None else None,
            restore_id=self.restore_id,
            transaction_id=self.transaction_id,
            error=error,
            warnings=list(warnings),
        )
