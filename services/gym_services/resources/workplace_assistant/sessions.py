"""Per-session tool environments and the checkpoint session hooks (:mod:`gym_services.resources.common.hooks`).

The control plane calls the hooks while admission is closed (no tool call runs concurrently); the
lock only keeps the session map itself consistent across threads, since export runs in a worker
thread off the event loop.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from gym_services.resources.common.hooks import SessionCapture

from .codec import (
    InvalidSessionState,
    base_digest,
    canonical_json,
    decode_base,
    decode_session,
    encode_base,
    encode_session,
    encode_tables,
)
from .environment import PristineTables, TableKey, WorkplaceEnvironment, pristine_tables
from .tools import call_tool


@dataclass(frozen=True)
class StagedSessions:
    """Rebuilt sessions and the stored bases they need, not installed yet."""

    bases: dict[str, PristineTables]
    sessions: dict[str, WorkplaceEnvironment]


class SessionNotFound(KeyError):
    """No tool environment is held for this session (never seeded, verified, or retired)."""


class WorkplaceSessions:
    """session_id -> :class:`WorkplaceEnvironment`, plus checkpoint export/restore/retire."""

    def __init__(self, pristine: PristineTables | None = None) -> None:
        self._pristine = pristine if pristine is not None else pristine_tables()
        self._sessions: dict[str, WorkplaceEnvironment] = {}
        self._bases: dict[str, PristineTables] = {base_digest(self._pristine): self._pristine}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ data path

    def seed(self, session_id: str) -> WorkplaceEnvironment:
        """A fresh environment for the session (replacing any it had)."""
        env = WorkplaceEnvironment.fresh(self._pristine)
        with self._lock:
            self._sessions[session_id] = env
        return env

    def find(self, session_id: str) -> WorkplaceEnvironment | None:
        with self._lock:
            return self._sessions.get(session_id)

    def get(self, session_id: str) -> WorkplaceEnvironment:
        with self._lock:
            env = self._sessions.get(session_id)
        if env is None:
            raise SessionNotFound(session_id)
        return env

    def call_tool(self, session_id: str, name: str, arguments: Mapping[str, Any] | str | None) -> object:
        """Run a tool in the session; raises :class:`SessionNotFound` for an unknown session."""
        return call_tool(self.get(session_id), name, arguments)

    def drop(self, session_id: str) -> WorkplaceEnvironment | None:
        with self._lock:
            return self._sessions.pop(session_id, None)

    def __contains__(self, session_id: object) -> bool:
        with self._lock:
            return session_id in self._sessions

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def session_ids(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    # ------------------------------------------------------------------ checkpoint hooks

    def export_session_states(self) -> dict[str, dict[str, Any]]:
        """Every held session's state (diff against its base); absent sessions are simply absent."""
        with self._lock:
            held = list(self._sessions.items())
        return {session_id: encode_session(env) for session_id, env in held}

    def capture_session_states(self) -> SessionCapture:
        """Every held session frozen as it is (no copy: see :meth:`WorkplaceEnvironment.capture`), and its base."""
        with self._lock:
            held = list(self._sessions.items())
        sessions: dict[str, tuple[Hashable, Any]] = {}
        bases: dict[int, PristineTables] = {}
        for session_id, env in held:
            token, tables = env.capture()
            sessions[session_id] = (token, (tables, env.base))
            bases[id(env.base)] = env.base
        shared: dict[str, Any] = {base_digest(b): b for b in bases.values()}
        return SessionCapture(sessions, shared)

    def encode_captured_session(self, frozen: tuple[Mapping[TableKey, Any], PristineTables]) -> dict[str, Any]:
        """A session as :meth:`capture_session_states` froze it (its tables and base), as ``export`` encodes it."""
        tables, base = frozen
        return encode_tables(tables, base)

    def encode_captured_shared(self, frozen: PristineTables) -> dict[str, Any]:
        """A base as :meth:`capture_session_states` froze it."""
        return encode_base(frozen)

    def base_states(self) -> dict[str, dict[str, Any]]:
        """digest -> encoded base for every base a held session refers to (write once per checkpoint).

        Fresh copies, so a caller may keep or change them without touching the codec's cache.
        """
        with self._lock:
            bases = {id(env.base): env.base for env in self._sessions.values()}
        return {base_digest(b): json.loads(canonical_json(encode_base(b))) for b in bases.values()}

    def register_bases(self, bases: Mapping[str, Mapping[str, Any]]) -> None:
        """Make stored bases known (each checked against its digest) without restoring sessions."""
        decoded = self._decode_bases(bases)
        with self._lock:
            self._bases.update(decoded)

    def restore_session_states(
        self,
        states: Mapping[str, Mapping[str, Any]],
        bases: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Rebuild every session first; install all of them only if every one is valid."""
        self.install_session_states(self.stage_session_states(states, bases))

    def stage_session_states(
        self, states: Mapping[str, object], bases: Mapping[str, object] | None = None
    ) -> StagedSessions:
        """Rebuild every session (changing nothing); :class:`InvalidSessionState` if any one is not valid.

        ``bases`` are stored bases (digest -> encoded base, see :meth:`base_states`) for states
        seeded from pristine tables other than this process's own; the control plane passes the
        checkpoint's shared states here.
        """
        if not isinstance(states, Mapping):
            raise InvalidSessionState("session states must be a JSON object")
        with self._lock:
            known = dict(self._bases)
        new_bases = self._decode_bases(bases or {})
        known.update(new_bases)
        rebuilt: dict[str, WorkplaceEnvironment] = {}
        for session_id, state in states.items():
            if not isinstance(session_id, str):
                raise InvalidSessionState(f"session id {session_id!r} is not a string")
            try:
                rebuilt[session_id] = decode_session(state, known)
            except InvalidSessionState as exc:
                raise InvalidSessionState(f"session {session_id}: {exc}") from None
        return StagedSessions(new_bases, rebuilt)

    def install_session_states(self, staged: StagedSessions) -> None:
        """Put rebuilt sessions (and the bases they were decoded against) in place."""
        with self._lock:
            self._bases.update(staged.bases)
            self._sessions.update(staged.sessions)

    # The optional shared-state hook: the bases, one record per digest.

    def export_shared_states(self) -> dict[str, dict[str, Any]]:
        """Same as :meth:`base_states` (the control plane writes each as ``shared-<digest>``)."""
        return self.base_states()

    def restore_shared_states(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Same as :meth:`register_bases`. A base registered by a restore whose sessions then
        fail is harmless: it is content-addressed."""
        self.register_bases(states)

    def retire_session_state(self, session_id: str) -> None:
        """Forget the session's tool environment (a later tool call gets session-not-found)."""
        self.drop(session_id)

    def _decode_bases(self, bases: Mapping[str, object]) -> dict[str, PristineTables]:
        out: dict[str, PristineTables] = {}
        for digest, encoded in bases.items():
            if digest in self._bases:
                continue  # already known: content-addressed, so identical
            if not isinstance(encoded, Mapping):
                raise InvalidSessionState(f"base {str(digest)[:12]} is not a JSON object")
            out[digest] = decode_base(digest, encoded)
        return out
