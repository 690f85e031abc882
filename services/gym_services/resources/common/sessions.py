"""The participant of a resources server: live sessions keyed by cookie session id (DESIGN §5).

A server declares ``checkpoint_mode``:

- ``restart_only`` (default): every live session blocks a checkpoint;
- ``exported``: the server implements the three session hooks and sessions are saved;
- ``stateless``: no session state, commit writes nothing, ``replay`` verify keeps serving.

and ``checkpoint_verify`` (``wait`` or ``replay``), advertised to agents in the
``x-ng-checkpoint-verify`` header of the ``/seed_session`` reply.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import FIRST_SESSION_HEADER, RolloutIdentity
from gym_services.control.models import Blocker
from gym_services.control.participant import InvalidState, Participant, Record, RestoredRecord, Scope
from gym_services.control.protocol import VERIFY_HEADER, CheckpointMode, Role, VerifyMode
STATE_SCHEMA_VERSION = 1

log = logging.getLogger(__name__)


@runtime_checkable
class SessionHooks(Protocol):
    """What an ``exported`` server implements, keyed by cookie session id."""

    def export_session_states(self) -> dict[str, Any]:
        """JSON-serializable state per live session; sessions no longer held are left out."""

    def restore_session_states(self, states: dict[str, Any]) -> None:
        """Validate every state, then install all; raise InvalidState (install nothing) otherwise."""

    def retire_session_state(self, session_id: str) -> None:
        """Drop the session."""


class SharedStateHooks(Protocol):
    """Optional: state shared by many sessions (e.g. pristine tables), written once per checkpoint."""

    def export_shared_states(self) -> dict[str, Any]: ...

    def restore_shared_states(self, states: dict[str, Any]) -> None: ...


@dataclass
class _Restored:
    sessions: dict[str, RolloutIdentity | None]


class ResourcesParticipant(Participant):
    """Tracks which sessions are live and which rollout each belongs to."""

    role = Role.RESOURCES

    def __init__(
        self,
        hooks: SessionHooks | None = None,
        *,
        mode: CheckpointMode = CheckpointMode.RESTART_ONLY,
        verify: VerifyMode = VerifyMode.WAIT,
        role: Role = Role.RESOURCES,
    ) -> None:
        if mode == CheckpointMode.EXPORTED and not isinstance(hooks, SessionHooks):
            raise TypeError("checkpoint_mode 'exported' needs the three session hooks")
        self.hooks = hooks
        self.checkpoint_mode = CheckpointMode(mode)  # type: ignore[misc]
        self.checkpoint_verify = VerifyMode(verify)  # type: ignore[misc]
        self.role = Role(role)  # type: ignore[misc]
        self.sessions: dict[str, RolloutIdentity | None] = {}
        self.retired: set[str] = set()
        self.restored: set[str] = set()

    # --- called by the server's routes ---------------------------------------------

    def seed_headers(self) -> dict[str, str]:
        return {VERIFY_HEADER: self.checkpoint_verify}

    def track(self, session_id: str, identity: RolloutIdentity | None) -> None:
        """A session was created (``/seed_session``, ``/reset``)."""
        self.retired.discard(session_id)
        self.sessions[session_id] = identity

    def seeded(self, session_id: str, headers: Mapping[str, str]) -> RolloutIdentity | None:
        """A ``/seed_session`` created a session: track it under the call's rollout identity.

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
        self.track(session_id, identity)
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

    def blockers(self) -> list[Blocker]:
        if self.checkpoint_mode != CheckpointMode.RESTART_ONLY:
            return []
        return [
            Blocker(
                kind="session",
                id=sid,
                detail="restart_only server holds a live session"
                + (f" of rollout {ident.rollout_id}" if ident else ""),
            )
            for sid, ident in self.sessions.items()
        ]

    async def export(self, scope: Scope) -> list[Record]:
        if self.checkpoint_mode != CheckpointMode.EXPORTED:
            return []
        assert self.hooks is not None
        return await asyncio.to_thread(self._export_sync, scope)

    def _export_sync(self, scope: Scope) -> list[Record]:
        assert self.hooks is not None
        states = self.hooks.export_session_states()
        records: list[Record] = []
        for sid, state in states.items():
            ident = self.sessions.get(sid)
            if not scope.includes(ident.rollout_id if ident else None):
                continue
            payload = {"schema_version": STATE_SCHEMA_VERSION, "session_id": sid, "state": state}
            records.append(
                Record(
                    key=f"session-{sid}",
                    data=_dumps(payload),
                    rollout_id=ident.rollout_id if ident else None,
                    attempt=ident.attempt if ident else None,
                )
            )
        if records and hasattr(self.hooks, "export_shared_states"):
            for name, state in self.hooks.export_shared_states().items():
                records.append(Record(key=f"shared-{name}", data=_dumps({"schema_version": STATE_SCHEMA_VERSION, "state": state})))
        return records

    async def release_out_of_scope(self, scope: Scope) -> None:
        for sid in list(self.restored):
            ident = self.sessions.get(sid)
            if not scope.includes(ident.rollout_id if ident else None):
                self._drop(sid)

    async def validate(self, records: list[RestoredRecord]) -> _Restored:
        """Parse every record, then hand all states to the server's validate-then-install hook."""
        if self.checkpoint_mode != CheckpointMode.EXPORTED:
            if records:
                raise InvalidState(f"a {self.checkpoint_mode} server cannot restore {len(records)} records")
            return _Restored({})
        assert self.hooks is not None
        states: dict[str, Any] = {}
        shared: dict[str, Any] = {}
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

        def install_all() -> None:
            if shared:
                if not hasattr(hooks, "restore_shared_states"):
                    raise InvalidState("records hold shared state this server does not take")
                hooks.restore_shared_states(shared)  # type: ignore[attr-defined]
            hooks.restore_session_states(states)

        try:
            await asyncio.to_thread(install_all)
        except InvalidState:
            raise
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidState(f"{type(exc).__name__}: {exc}") from None
        return _Restored(identities)

    async def install(self, validated: _Restored) -> None:
        for sid, ident in validated.sessions.items():
            self.sessions[sid] = ident
            self.restored.add(sid)
            self.retired.discard(sid)

    async def uninstall(self, validated: _Restored) -> None:
        for sid in validated.sessions:
            self._drop(sid)

    async def retire(self, rollout_id: str, attempt: int) -> bool:
        victims = self._sessions_of(rollout_id, attempt)
        for sid in victims:
            self._drop(sid)
            self.retired.add(sid)
        return bool(victims)

    def _sessions_of(self, rollout_id: str, attempt: int) -> list[str]:
        """Live sessions of the rollout from this attempt or an earlier one."""
        return [
            sid
            for sid, ident in self.sessions.items()
            if ident is not None and ident.rollout_id == rollout_id and ident.attempt <= attempt
        ]

    def _drop(self, sid: str) -> None:
        if self.hooks is not None:
            self.hooks.retire_session_state(sid)
        self.sessions.pop(sid, None)
        self.restored.discard(sid)

    def live(self) -> dict[str, Any]:
        return {"sessions": len(self.sessions)}


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
