"""The participant of a resources (or environment) server, one class per checkpoint mode.

Every resources server's ``create_app`` builds one and passes it to the app factory
(:func:`gym_services.server.app.create_server_app`); its routes call :meth:`SessionParticipant.seed`
and :meth:`SessionParticipant.session`, the control plane (:mod:`gym_services.control.plane`) calls
the :class:`~gym_services.control.participant.Participant` interface. Live sessions are keyed by
the cookie session id (:mod:`gym_services.base.sessions`) and remembered with the rollout identity
of the call that created them. The mode is the class (``docs/participants.md``, "Resources and environment servers"):

- :class:`RestartOnlyParticipant`: every live session blocks a checkpoint; nothing is saved;
- :class:`ExportedParticipant`: sessions are saved through the server's :class:`SessionHooks`
  and restored under attempt + 1;
- :class:`StatelessParticipant`: no session state; a checkpoint holds no records of it.

Each advertises its verify mode (``wait`` or ``replay``) in the ``x-ng-checkpoint-verify`` header
of the seed reply.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Never, TypeVar

from starlette.requests import Request

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import FIRST_SESSION_HEADER, RolloutIdentity
from gym_services.base.sessions import session_id
from gym_services.control.models import Blocker, ScopeReport
from gym_services.control.participant import (
    Capture,
    F,
    FrozenRecord,
    InvalidState,
    NothingToRestore,
    Participant,
    Record,
    RestoredRecord,
    Scope,
    V,
)
from gym_services.control.protocol import VERIFY_HEADER, CheckpointMode, Role, VerifyMode
from gym_services.resources.common.hooks import (
    CapturesSessions,
    RetiresSessions,
    S,
    SessionHooks,
    SharedStateHooks,
    session_hook_problems,
)

STATE_SCHEMA_VERSION = 1
T = TypeVar("T")

log = logging.getLogger(__name__)


def session_not_found(sid: str) -> Exception:
    """The default answer for a session the server does not hold."""
    return ApiError(ErrorCode.SESSION_NOT_FOUND, f"session {sid} is unknown; call /seed_session first")


class SessionParticipant(Participant[V, F], Generic[V, F]):
    """Tracks which sessions are live and which rollout each belongs to; the mode is the subclass."""

    checkpoint_mode: ClassVar[CheckpointMode]
    session_keyed = True

    def __init__(
        self,
        store: RetiresSessions | None = None,
        *,
        verify: VerifyMode = VerifyMode.WAIT,
        role: Role = Role.RESOURCES,
    ) -> None:
        """``store`` is where the server keeps its sessions (dropped from it at retire); ``role`` is
        ``environment`` for a Gymnasium-style server."""
        self.store = store
        self.checkpoint_verify = VerifyMode(verify)
        self.role = Role(role)
        self.sessions: dict[str, RolloutIdentity | None] = {}
        self.retired: set[str] = set()
        self.restored: set[str] = set()

    # --- called by the server's routes ---------------------------------------------

    async def seed(self, request: Request, create: Callable[[str], Awaitable[Any] | Any]) -> str:
        """``/seed_session`` (``/reset``): ``create(session id)`` the request's session, then track it.

        Answer with :meth:`seed_headers`. Returns the session id.
        """
        sid = session_id(request)
        made = create(sid)
        if inspect.isawaitable(made):
            await made
        self.seeded(sid, request.headers)
        return sid

    def session(
        self,
        request: Request,
        get: Callable[[str], T | None],
        missing: Callable[[str], Exception] = session_not_found,
    ) -> tuple[str, T]:
        """The request's session id and what the server holds for it (``get(session id)``).

        A retired session's cookie is ``409 stale_attempt``; a session the server does not hold is
        ``missing(session id)`` (``404 session_not_found`` unless the server answers otherwise).
        """
        sid = session_id(request)
        self.check_session(sid)
        held = get(sid)
        if held is None:
            raise missing(sid)
        return sid, held

    def seed_headers(self) -> dict[str, str]:
        return {VERIFY_HEADER: self.checkpoint_verify}

    def seeded(self, session_id: str, headers: Mapping[str, str]) -> RolloutIdentity | None:
        """A seed created a session: track it under the call's rollout identity.

        An agent that holds no session of this server says so (``x-ng-first-session: 1``). Any
        other session of that rollout up to this attempt is then unreachable: it is what a seed in
        flight at a checkpoint created, restored for an episode whose boundary was still before the
        seed (seeding is a replay step). It is dropped here instead of living until a retire.
        """
        identity = RolloutIdentity.from_headers(headers)
        if identity is not None and headers.get(FIRST_SESSION_HEADER) == "1":
            for sid in self._sessions_of(identity.rollout_id, identity.attempt):
                if sid != session_id:
                    log.info(
                        "dropped an unreachable session of the rollout at a new seed",
                        extra={"session_id": sid, "rollout_id": identity.rollout_id, "attempt": identity.attempt},
                    )
                    self._drop(sid)
                    self.retired.add(sid)
        self.retired.discard(session_id)
        self.sessions[session_id] = identity
        return identity

    def end(self, session_id: str) -> None:
        """The session finished (a successful ``/verify``, an episode that is done)."""
        self.sessions.pop(session_id, None)
        self.restored.discard(session_id)

    def check_session(self, session_id: str) -> None:
        """Refuse a retired session's cookie."""
        if session_id in self.retired:
            raise ApiError(ErrorCode.STALE_ATTEMPT, f"session {session_id} was retired; its attempt is over")

    # --- participant ------------------------------------------------------------------

    async def release_out_of_scope(self, scope: Scope) -> None:
        for sid in list(self.restored):
            ident = self.sessions.get(sid)
            if not scope.includes(ident.rollout_id if ident else None):
                self._drop(sid)

    async def retire(self, rollout_id: str, attempt: int) -> bool:
        victims = self._sessions_of(rollout_id, attempt)
        for sid in victims:
            self._drop(sid)
            self.retired.add(sid)
        return bool(victims)

    def live(self) -> dict[str, Any]:
        return {"sessions": len(self.sessions)}

    def _sessions_of(self, rollout_id: str, attempt: int) -> list[str]:
        """Live sessions of the rollout from this attempt or an earlier one."""
        return [
            sid
            for sid, ident in self.sessions.items()
            if ident is not None and ident.rollout_id == rollout_id and ident.attempt <= attempt
        ]

    def _drop(self, sid: str) -> None:
        if self.store is not None:
            self.store.retire_session_state(sid)
        self.sessions.pop(sid, None)
        self.restored.discard(sid)


class RestartOnlyParticipant(SessionParticipant[None, Never], NothingToRestore):
    """Sessions cannot be saved: every live session blocks a checkpoint until it ends or is retired."""

    checkpoint_mode = CheckpointMode.RESTART_ONLY

    def blockers(self) -> list[Blocker]:
        return [
            Blocker(
                kind="session",
                id=sid,
                detail="restart_only server holds a live session"
                + (f" of rollout {ident.rollout_id}" if ident else ""),
            )
            for sid, ident in self.sessions.items()
        ]


class StatelessParticipant(SessionParticipant[None, Never], NothingToRestore):
    """Nothing to save: persist writes an empty manifest; with ``replay`` verify its routes keep serving.

    A server that seeds sessions through its participant keeps state per session: it is not stateless. While it
    holds any, every checkpoint is refused at prepare (:meth:`mode_conflict`), since a restore would bring none of
    them back."""

    checkpoint_mode = CheckpointMode.STATELESS

    def mode_conflict(self) -> str | None:
        if not self.sessions:
            return None
        return (
            f"it holds {len(self.sessions)} sessions, which a checkpoint would lose (after a restore "
            "each would answer 404 session_not_found); declare it exported (its store implementing the session "
            "hooks) or restart_only"
        )


@dataclass(frozen=True)
class StagedSessions(Generic[S]):
    """What :meth:`ExportedParticipant.validate` built: the store's staged states and each session's identity."""

    staged: S
    identities: dict[str, RolloutIdentity | None]


@dataclass(frozen=True)
class FrozenSession:
    """One session as the store froze it under the pause; ``encodings`` is where its capture keeps its bytes."""

    session_id: str
    token: Hashable
    frozen: object
    encodings: dict[str, tuple[Hashable, bytes]]


@dataclass(frozen=True)
class FrozenShared:
    """Shared state (e.g. pristine tables) as the store froze it under the pause."""

    frozen: object


class SessionEncoder:
    """The :class:`~gym_services.control.participant.RecordEncoder` of an :class:`ExportedParticipant`: a frozen
    session or shared state through its store's encode hooks (:class:`CapturesSessions`), into a record's JSON.

    Keeps each session's newest bytes (:attr:`encodings`, session id -> (change token, bytes)), so a
    session whose token is unchanged at the next capture is not encoded again.
    """

    def __init__(self, store: CapturesSessions) -> None:
        self.store = store
        self.encodings: dict[str, tuple[Hashable, bytes]] = {}

    def encode(self, state: FrozenSession | FrozenShared) -> bytes:
        if isinstance(state, FrozenShared):
            return _dumps(
                {"schema_version": STATE_SCHEMA_VERSION, "state": self.store.encode_captured_shared(state.frozen)}
            )
        encoded = self.store.encode_captured_session(state.frozen)
        return _dumps({"schema_version": STATE_SCHEMA_VERSION, "session_id": state.session_id, "state": encoded})

    def encoded(self, state: FrozenSession | FrozenShared, data: bytes) -> None:
        if isinstance(state, FrozenSession):
            state.encodings[state.session_id] = (state.token, data)


class ExportedParticipant(SessionParticipant[StagedSessions[S], FrozenSession | FrozenShared], Generic[S]):
    """Sessions are saved through the server's :class:`SessionHooks` and restored under attempt + 1."""

    checkpoint_mode = CheckpointMode.EXPORTED

    def __init__(
        self, hooks: SessionHooks[S], *, verify: VerifyMode = VerifyMode.WAIT, role: Role = Role.RESOURCES
    ) -> None:
        problems = session_hook_problems(hooks)
        if problems:
            raise TypeError(
                f"{type(hooks).__name__} does not implement the session hooks of an exported server "
                f"(gym_services.resources.common.hooks): " + "; ".join(problems)
            )
        super().__init__(hooks, verify=verify, role=role)
        self.hooks: SessionHooks[S] = hooks
        if isinstance(hooks, CapturesSessions):
            self.encoder = self.session_encoder = SessionEncoder(hooks)

    async def export(self, scope: Scope) -> list[Record]:
        records, _ = await asyncio.to_thread(self._export_sync, scope)
        return records

    async def capture(self, scope: Scope) -> Capture[FrozenSession | FrozenShared]:
        """Every session in scope frozen in O(1) (a store that :class:`CapturesSessions`), encoded after resume.

        A store without the capture hook is exported now, under the pause. Either way the capture reports the
        sessions the scope did not keep by their rollout (:meth:`~gym_services.control.participant.Scope.leave_out`).
        """
        if not isinstance(self.hooks, CapturesSessions):
            exported, report = await asyncio.to_thread(self._export_sync, scope)
            return Capture(exported, report)
        captured = self.hooks.capture_session_states()
        dropped, report = scope.leave_out({sid: self._rollout_of(sid) for sid in captured.sessions})
        earlier: dict[str, tuple[Hashable, bytes]] = self.session_encoder.encodings
        encodings: dict[str, tuple[Hashable, bytes]] = {}
        self.session_encoder.encodings = encodings  # unchanged sessions now; the others as the persist encodes them
        records: list[Record | FrozenRecord[FrozenSession | FrozenShared]] = []
        for sid, (token, frozen) in captured.sessions.items():
            if sid in dropped:
                continue
            ident = self.sessions.get(sid)
            rollout_id, attempt = (ident.rollout_id, ident.attempt) if ident else (None, None)
            cached = earlier.get(sid)
            if cached is not None and cached[0] == token:  # unchanged since the last capture: its bytes as they were
                encodings[sid] = cached
                records.append(Record(f"session-{sid}", cached[1], rollout_id, attempt))
                continue
            state = FrozenSession(sid, token, frozen, encodings)
            records.append(FrozenRecord(f"session-{sid}", state, rollout_id=rollout_id, attempt=attempt))
        if records:
            for name, shared in captured.shared.items():
                records.append(FrozenRecord(f"shared-{name}", FrozenShared(shared)))
        return Capture(records, report)

    def _rollout_of(self, sid: str) -> str | None:
        ident = self.sessions.get(sid)
        return ident.rollout_id if ident else None

    def _export_sync(self, scope: Scope) -> tuple[list[Record], ScopeReport]:
        states = self.hooks.export_session_states()
        dropped, report = scope.leave_out({sid: self._rollout_of(sid) for sid in states})
        records: list[Record] = []
        for sid, state in states.items():
            if sid in dropped:
                continue
            ident = self.sessions.get(sid)
            payload = {"schema_version": STATE_SCHEMA_VERSION, "session_id": sid, "state": state}
            records.append(
                Record(
                    key=f"session-{sid}",
                    data=_dumps(payload),
                    rollout_id=ident.rollout_id if ident else None,
                    attempt=ident.attempt if ident else None,
                )
            )
        if records and isinstance(self.hooks, SharedStateHooks):
            for name, state in self.hooks.export_shared_states().items():
                records.append(
                    Record(key=f"shared-{name}", data=_dumps({"schema_version": STATE_SCHEMA_VERSION, "state": state}))
                )
        return records, report

    async def validate(self, records: list[RestoredRecord]) -> StagedSessions[S]:
        """Parse every record and let the store stage every state; nothing is installed yet."""
        states: dict[str, object] = {}
        shared: dict[str, object] = {}
        identities: dict[str, RolloutIdentity | None] = {}
        for record in records:
            payload = _loads(record)
            if record.key.startswith("shared-"):
                shared[record.key[len("shared-") :]] = payload.get("state")
                continue
            sid = payload.get("session_id")
            if not isinstance(sid, str) or record.key != f"session-{sid}":
                raise InvalidState(f"record {record.key} does not hold the session its key names")
            states[sid] = payload.get("state")
            identities[sid] = (
                RolloutIdentity(rollout_id=record.rollout_id, attempt=record.new_attempt or 0)
                if record.rollout_id
                else None
            )
        hooks = self.hooks
        if shared and not isinstance(hooks, SharedStateHooks):
            raise InvalidState("records hold shared state this server does not take")

        def stage() -> S:
            if shared and isinstance(hooks, SharedStateHooks):
                staged: S = hooks.stage_session_states(states, shared)
                return staged
            return hooks.stage_session_states(states)

        try:
            staged = await asyncio.to_thread(stage)
        except InvalidState:
            raise
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidState(f"{type(exc).__name__}: {exc}") from None
        return StagedSessions(staged, identities)

    async def install(self, validated: StagedSessions[S]) -> None:
        self.hooks.install_session_states(validated.staged)
        for sid, ident in validated.identities.items():
            self.sessions[sid] = ident
            self.restored.add(sid)
            self.retired.discard(sid)

    async def uninstall(self, validated: StagedSessions[S]) -> None:
        for sid in validated.identities:
            self._drop(sid)


def participant_for(
    mode: CheckpointMode, store: SessionHooks[S], *, verify: VerifyMode = VerifyMode.WAIT, role: Role = Role.RESOURCES
) -> RestartOnlyParticipant | ExportedParticipant[S] | StatelessParticipant:
    """The participant of a server whose mode is configurable (the counter example's ``checkpoint_mode``)."""
    mode = CheckpointMode(mode)
    if mode is CheckpointMode.EXPORTED:
        return ExportedParticipant(store, verify=verify, role=role)
    if mode is CheckpointMode.RESTART_ONLY:
        return RestartOnlyParticipant(store, verify=verify, role=role)
    return StatelessParticipant(store, verify=verify, role=role)


def _dumps(value: Any) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidState(f"session state is not JSON-serializable: {exc}") from None


def _loads(record: RestoredRecord) -> dict[str, Any]:
    try:
        payload = json.loads(record.data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidState(f"record {record.key} is not JSON: {exc}") from None
    if not isinstance(payload, dict) or payload.get("schema_version") != STATE_SCHEMA_VERSION:
        raise InvalidState(f"record {record.key} has an unsupported schema_version")
    return payload
