"""Session state of the indirect prompt injection server and its checkpoint codec.

A session is the task's environment (a JSON object that tools read and change in place) plus what
tools need to mint IDs: NeMo Gym's tools draw six hex digits from ``uuid4``; ours draw them from a
stream that is a pure function of the environment as seeded and a counter (``sha256("<seed>:<n>")``).
Seed and counter travel in the checkpoint, so a restored session mints exactly the IDs the original
would have minted next, and answers byte for byte as the original would.

The environment holds what JSON parsing produces, which in Python's parser (the one FastAPI uses)
includes ``NaN`` and ``±Infinity``; the checkpoint keeps the environment as JSON *text* written and
read by that same parser, so those values, key order, ``1`` vs ``1.0`` and ``-0.0`` all survive.
Anything else JSON cannot carry (a set, a tuple, a non-string key) is refused with its path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from gym_services.control.participant import InvalidState

STATE_SCHEMA_VERSION = 2
ID_SEED_PATTERN = r"^[0-9a-f]{16}$"


class NonJsonValue(InvalidState):
    """An environment holds a value JSON cannot carry (a set, a tuple, a non-string key, ...)."""


def check_json(value: Any, path: str = "environment") -> None:
    """Refuse anything a JSON round trip would drop or change; the error names the path.

    Only exact ``dict``/``list``/``str``/``int``/``float``/``bool``/``None`` pass: a tuple would come
    back as a list and an ``int`` key as a string, so the restored session would differ.
    """
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        kind = type(item)
        if item is None or kind in (str, bool, int, float):
            continue
        if kind is dict:
            for key, child in item.items():
                if type(key) is not str:
                    raise NonJsonValue(f"{where} has a {type(key).__name__} key {key!r}; JSON keys are strings")
                stack.append((child, f"{where}.{key}"))
            continue
        if kind is list:
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
            continue
        raise NonJsonValue(f"{where} holds a {kind.__name__}, which JSON cannot carry")


def environment_text(environment: Any, path: str = "environment") -> str:
    """The environment as ASCII JSON text (key order kept, non-finite floats as ``NaN``/``Infinity``,
    lone surrogates as escapes, so any record writer can store it)."""
    check_json(environment, path)
    return json.dumps(environment)


def json_copy(value: Any, path: str = "environment") -> Any:
    """A deep copy made through JSON text: same key order, no shared objects, JSON values only."""
    return json.loads(environment_text(value, path))


def environment_digest(environment: Mapping[str, Any]) -> str:
    """The seed of a session's ID stream: the same task mints the same IDs in every run."""
    canonical = json.dumps(environment, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass
class Session:
    """One seeded environment and the ID stream its tools draw from."""

    environment: dict[str, Any]
    id_seed: str
    next_id: int = 0

    @classmethod
    def seeded(cls, environment: Mapping[str, Any]) -> Session:
        env = json_copy(dict(environment))
        return cls(environment=env, id_seed=environment_digest(env))

    def draw_hex(self) -> str:
        """The next six hex digits of the stream (upper case), as NeMo Gym's tools take from ``uuid4``."""
        n = self.next_id
        self.next_id += 1
        return hashlib.sha256(f"{self.id_seed}:{n}".encode()).hexdigest()[:6].upper()

    def mint_id(self, prefix: str) -> str:
        return f"{prefix}{self.draw_hex()}"


#: the session whose tool is running (tools mint IDs through :func:`new_id`)
_ACTIVE: ContextVar[Session] = ContextVar("ipi_active_session")


@contextlib.contextmanager
def active(session: Session) -> Iterator[Session]:
    token = _ACTIVE.set(session)
    try:
        yield session
    finally:
        _ACTIVE.reset(token)


def new_id(prefix: str) -> str:
    """A fresh ID for the running tool: ``prefix`` + six upper-case hex digits from the session's stream."""
    return _ACTIVE.get().mint_id(prefix)


class SessionState(BaseModel):
    """What one session's checkpoint record holds (versioned, strict)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    schema_version: Literal[2]
    environment_json: str = Field(description="the environment as JSON text (Python's json module)")
    id_seed: str = Field(pattern=ID_SEED_PATTERN)
    next_id: int = Field(ge=0)


class SessionStateV1(BaseModel):
    """Records written before non-finite floats were carried: the environment as a JSON object."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    schema_version: Literal[1]
    environment: dict[str, JsonValue]
    id_seed: str = Field(pattern=ID_SEED_PATTERN)
    next_id: int = Field(ge=0)


def encode_session(session_id: str, session: Session) -> dict[str, Any]:
    """The JSON state of one session; never aliases the live environment."""
    return {
        "schema_version": STATE_SCHEMA_VERSION,
        "environment_json": environment_text(session.environment, f"session {session_id}: environment"),
        "id_seed": session.id_seed,
        "next_id": session.next_id,
    }


def _problems(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)[:5]
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(state)'}: {err['msg']}" for err in errors)


def decode_session(session_id: str, raw: object) -> Session:
    """Validate one exported state and build a fresh session from it (raises InvalidState)."""
    if not isinstance(session_id, str) or not session_id:
        raise InvalidState(f"session id {session_id!r} is not a non-empty string")
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    try:
        if version == 1:
            old = SessionStateV1.model_validate(raw)
            environment = json_copy(old.environment, f"session {session_id}: environment")
            return Session(environment=environment, id_seed=old.id_seed, next_id=old.next_id)
        state = SessionState.model_validate(raw)
    except ValidationError as exc:
        raise InvalidState(f"session {session_id}: invalid state: {_problems(exc)}") from None
    try:
        environment = json.loads(state.environment_json)
    except ValueError as exc:
        raise InvalidState(f"session {session_id}: invalid state: environment_json: {exc}") from None
    if not isinstance(environment, dict):
        raise InvalidState(f"session {session_id}: invalid state: environment_json is not a JSON object")
    return Session(environment=environment, id_seed=state.id_seed, next_id=state.next_id)


class SessionStore:
    """Cookie session id -> session; the session hooks of an ``exported`` server."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}

    def get(self, session_id: str) -> Session | None:
        return self.sessions.get(session_id)

    def seed(self, session_id: str, environment: Mapping[str, Any]) -> Session:
        session = Session.seeded(environment)
        self.sessions[session_id] = session
        return session

    def drop(self, session_id: str) -> Session | None:
        return self.sessions.pop(session_id, None)

    # --- session hooks --------------------------------------------------------------

    def export_session_states(self) -> dict[str, Any]:
        """Every session still held; one that ``/verify`` dropped is simply absent."""
        return {sid: encode_session(sid, session) for sid, session in list(self.sessions.items())}

    def restore_session_states(self, states: dict[str, Any]) -> None:
        """Validate every state first; install them all only when all of them pass."""
        self.install_session_states(self.stage_session_states(states))

    def stage_session_states(self, states: Mapping[str, object]) -> dict[str, Session]:
        """Every state decoded (nothing installed); :class:`InvalidState` for the first that is not valid."""
        return {sid: decode_session(sid, raw) for sid, raw in states.items()}

    def install_session_states(self, staged: dict[str, Session]) -> None:
        self.sessions.update(staged)

    def retire_session_state(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
