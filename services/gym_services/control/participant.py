"""The interface each server implements to take part in a checkpoint (``docs/participants.md``).

The control plane owns phases, admission, fencing, the lease and storage; a
participant only answers the questions that depend on what the server holds:
what still blocks prepare, which records describe its state (now, or frozen now and
encoded later by its :class:`RecordEncoder`), how to validate and install records, and how to drop
one attempt of a rollout.

A participant is generic in what :meth:`Participant.validate` builds from restored records and
:meth:`Participant.install` puts in place, and in the state its frozen records hold, which its encoder
takes (``Participant[V, F]``); one that keeps nothing a checkpoint needs is a :class:`NothingToRestore`
(``V`` is ``None``), one that captures only encoded records has ``F`` = ``Never``.

The way down from a capture to storage: the participant's :meth:`Participant.capture` returns
:class:`Record` s and :class:`FrozenRecord` s (data: what the capture froze); the control plane
(:mod:`.plane`) gives its :attr:`Participant.encoder` to its pack writer once, at construction, and
hands each capture to the persist worker (:mod:`.persists`), which runs the writer
(:mod:`.packs`): the encoder makes each frozen record's bytes (:mod:`.encoding`, in a forked child
when there are many), the writer packs them and the checkpoint store (:mod:`.store`) puts them in storage.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Generic, Never, Protocol, TypeVar

from gym_services.control.interfaces import interface_problems
from gym_services.control.models import (
    SCOPE_NAMED,
    Blocker,
    CheckpointMode,
    Role,
    ScopedSession,
    ScopeReport,
    VerifyMode,
)


class InvalidState(ValueError):
    """Restored records that cannot be installed; the control plane answers 422 invalid_state."""


@dataclass(frozen=True)
class Record:
    """One exported unit of state: a session, an episode, a shared base."""

    key: str
    data: bytes
    rollout_id: str | None = None
    attempt: int | None = None


S = TypeVar("S")
S_contra = TypeVar("S_contra", contravariant=True)


@dataclass(frozen=True)
class FrozenRecord(Generic[S]):
    """A record captured under the pause whose bytes are made later, after the stack resumed, by the
    participant's :class:`RecordEncoder` from ``state``: what the capture froze (never live state)."""

    key: str
    state: S
    rollout_id: str | None = None
    attempt: int | None = None


class RecordEncoder(Protocol[S_contra]):
    """Makes the bytes of a participant's :class:`FrozenRecord` s; the participant's :attr:`Participant.encoder`.

    :meth:`encode` runs after resume, in a worker thread or a forked child process
    (:mod:`gym_services.control.encoding`): it must read only the frozen state it is given and change
    nothing. :meth:`encoded` runs in the serving process once a record's bytes are made (a cache of
    encodings, for the next capture).
    """

    def encode(self, state: S_contra) -> bytes: ...

    def encoded(self, state: S_contra, data: bytes) -> None: ...


class EncodesNothing:
    """The encoder of a participant whose captures hold only encoded :class:`Record` s."""

    def encode(self, state: object) -> bytes:
        raise InvalidState(f"this participant captures no frozen records, but one holds {type(state).__name__}")

    def encoded(self, state: object, data: bytes) -> None:
        pass


ENCODES_NOTHING = EncodesNothing()


#: the state a participant's frozen records hold (``Never`` for one that captures only encoded records)
F = TypeVar("F")


class Capture(Generic[F]):
    """What a participant captured under the pause for one checkpoint: immutable from then on.

    Records already encoded (``Record``) and frozen records its participant's encoder makes bytes of
    later (``FrozenRecord``); the control plane writes them in the background after ``resume``
    (``docs/protocol.md``, "Transactions"). ``scope``: the sessions the checkpoint's scope did not keep by their
    rollout (:meth:`Scope.leave_out`), reported in the checkpoint's result.
    """

    def __init__(self, records: Sequence[Record | FrozenRecord[F]], scope: ScopeReport | None = None) -> None:
        self.records = list(records)
        self.scope = scope if scope is not None else ScopeReport()

    def __len__(self) -> int:
        return len(self.records)

    @property
    def episodes(self) -> list[str]:
        """Rollouts with records in this capture."""
        return sorted({r.rollout_id for r in self.records if r.rollout_id})

    def with_attempts(self, highest: Callable[[str], int | None]) -> Capture[F]:
        """A rollout's record without an attempt gets ``highest(rollout)`` (the fence's, at capture time)."""
        return Capture(
            [
                r if r.attempt is not None or r.rollout_id is None else replace(r, attempt=highest(r.rollout_id) or 0)
                for r in self.records
            ],
            self.scope,
        )


@dataclass(frozen=True)
class RestoredRecord:
    """A record read back and verified against its digest."""

    key: str
    data: bytes
    rollout_id: str | None
    attempt: int | None

    @property
    def new_attempt(self) -> int | None:
        """Restored episodes continue as attempt + 1."""
        return None if self.attempt is None else self.attempt + 1


@dataclass(frozen=True)
class Scope:
    """Which rollouts a checkpoint keeps: ``episodes=None`` keeps everything (``docs/protocol.md``, "Scope").

    What belongs to no rollout (a session seeded without identity headers, a shared base) is always kept.

    ``final``: the checkpoint is final (``docs/protocol.md``, "Termination"): the process is never resumed from it,
    so nothing it does after the capture is kept anywhere, and a participant may stop its work there (the policy
    model cuts its streams) instead of letting it go on."""

    episodes: frozenset[str] | None = None
    final: bool = False

    @classmethod
    def of(cls, episodes: Iterable[str] | None, *, final: bool = False) -> Scope:
        return cls(None if episodes is None else frozenset(episodes), final)

    def includes(self, rollout_id: str | None) -> bool:
        return self.episodes is None or rollout_id is None or rollout_id in self.episodes

    def leave_out(self, sessions: Mapping[str, str | None]) -> tuple[set[str], ScopeReport]:
        """The sessions (session id -> its rollout, None for none) this scope leaves out, and the report of those it
        did not keep by their rollout: dropped (a rollout outside the episodes) and kept without a rollout, the
        first :data:`~gym_services.control.models.SCOPE_NAMED` of each by name."""
        dropped: set[str] = set()
        named_dropped: list[ScopedSession] = []
        named_unowned: list[ScopedSession] = []
        unowned = 0
        for sid, rollout_id in sessions.items():
            if rollout_id is None:
                unowned += 1
                if len(named_unowned) < SCOPE_NAMED:
                    named_unowned.append(ScopedSession(session_id=sid))
            elif self.episodes is not None and rollout_id not in self.episodes:
                dropped.add(sid)
                if len(named_dropped) < SCOPE_NAMED:
                    named_dropped.append(ScopedSession(session_id=sid, rollout_id=rollout_id))
        report = ScopeReport(
            dropped=named_dropped, dropped_total=len(dropped), unowned=named_unowned, unowned_total=unowned
        )
        return dropped, report


#: what a participant's ``validate`` builds and its ``install``/``uninstall`` take
V = TypeVar("V")


class Participant(ABC, Generic[V, F]):
    """What a server implements to take part in checkpoints. The defaults hold nothing and block nothing;
    a server overrides what it holds, and says how it restores (``validate``/``install``/``uninstall``)."""

    role: Role  # a class attribute, or set per instance by a participant that serves several roles
    checkpoint_mode: ClassVar[CheckpointMode] = CheckpointMode.EXPORTED
    checkpoint_verify: VerifyMode = VerifyMode.WAIT  # the same; a session participant's is configured
    #: makes the bytes of the :class:`FrozenRecord` s :meth:`capture` returns; the control plane takes it once
    encoder: RecordEncoder[F] = ENCODES_NOTHING
    #: its state is keyed by the session cookie (a resources or environment server): admission then also fences a
    #: call by the rollout and attempt its session was made by (:func:`gym_services.control.admission.call_identity`)
    session_keyed: ClassVar[bool] = False

    def mode_conflict(self) -> str | None:
        """Why a checkpoint in this server's declared mode would lose what it holds now, or None when it would not.

        Asked by ``prepare`` before anything pauses; an answer refuses the checkpoint (``422 invalid_state``) with
        it, naming the server and its mode (``docs/participants.md``)."""
        return None

    async def prepare(self, checkpoint_id: str) -> None:
        """Admission just closed: start moving in-flight work to a boundary (cut, park, ...)."""

    def blockers(self) -> list[Blocker]:
        """What still keeps this server from a consistent boundary; polled until empty or the deadline."""
        return []

    async def export(self, scope: Scope) -> list[Record]:
        """The records of everything in ``scope``; runs while admission is closed."""
        return []

    async def capture(self, scope: Scope) -> Capture[F]:
        """The records of everything in ``scope`` as they are now, while admission is closed.

        Must be cheap: it is the pause. The default encodes now
        (:meth:`export`), which is right for a server with few, small records; a server with many
        sessions returns :class:`FrozenRecord` s, which its :attr:`encoder` encodes after resume.
        """
        return Capture(await self.export(scope))

    async def release_out_of_scope(self, scope: Scope) -> None:
        """Free restored state that the checkpoint's scope leaves out."""

    @abstractmethod
    async def validate(self, records: list[RestoredRecord]) -> V:
        """Check every record and build what :meth:`install` needs; must change nothing.

        Raise :class:`InvalidState` for records that cannot be installed."""

    @abstractmethod
    async def install(self, validated: V) -> None:
        """Install what :meth:`validate` built; must not fail half-way."""

    @abstractmethod
    async def uninstall(self, validated: V) -> None:
        """Undo :meth:`install` when the restore is aborted, so nothing stays installed."""

    async def resume(self) -> None:
        """The checkpoint is over: deliver held work, let parked work continue."""

    async def abort(self) -> None:
        """The checkpoint was abandoned; by default the same as resume."""
        await self.resume()

    async def retire(self, rollout_id: str, attempt: int) -> bool:
        """Stop that attempt's work, wait for it, free its state; True when something was dropped."""
        return False

    def live(self) -> dict[str, Any]:
        """Counts for ``status`` (sessions, episodes, held responses, ...)."""
        return {}


class NothingToRestore(Participant[None, Never]):
    """A participant whose checkpoints hold no records of it: a restore that brings records is refused."""

    async def validate(self, records: list[RestoredRecord]) -> None:
        if records:
            raise InvalidState(f"a {self.checkpoint_mode} server cannot restore {len(records)} records")

    async def install(self, validated: None) -> None:
        """Nothing to install."""

    async def uninstall(self, validated: None) -> None:
        """Nothing was installed."""


def check_participant(participant: Participant[Any, Any]) -> None:
    """Refuse, at start-up, a participant whose overrides do not fit the interface: a hook that is ``async`` in the
    interface made plain (or the other way round), or one that cannot take the arguments the control plane passes.
    ``TypeError`` naming each such method and its signature in the interface."""
    problems = interface_problems(participant, Participant, PARTICIPANT_HOOKS)
    if problems:
        raise TypeError(f"{type(participant).__name__} does not fit the participant interface: " + "; ".join(problems))


#: the methods of :class:`Participant` a server may override (the control plane calls them)
PARTICIPANT_HOOKS = (
    "mode_conflict",
    "prepare",
    "blockers",
    "export",
    "capture",
    "release_out_of_scope",
    "validate",
    "install",
    "uninstall",
    "resume",
    "abort",
    "retire",
    "live",
)
