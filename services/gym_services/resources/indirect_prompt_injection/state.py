"""Session state of the indirect prompt injection server and its checkpoint codec.

A session is the task's environment (a JSON object that tools read and change in
place) plus what tools need to mint IDs without randomness or the clock: a seed taken
from the environment when the session is seeded, and a counter. Both travel in the
checkpoint, so a restored session mints exactly the IDs the original would have minted
next, and its tool outputs match the original byte for byte.

The environment is always copied through JSON: the copy keeps key order (tool outputs
serialize the environment as stored), shares no object with the source, and anything
JSON cannot carry is refused with the path of the offending value.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from gym_services.control.participant import InvalidState

STATE_SCHEMA_VERSION = 1
ID_SEED_PATTERN = r"^[0-9a-f]{16}$"
MAX_MINT_ATTEMPTS = 10_000


class NonJsonValue(InvalidState):
    """An environment holds a value JSON cannot carry (a set, NaN, a non-string key, ...)."""


def check_json(value: Any, path: str = "environment") -> None:
    """Refuse anything a JSON round trip would drop or change; the error names the path.

    Only exact ``dict``/``list``/``str``/``int``/``float``/``bool``/``None`` pass: a tuple
    would come back as a list and an ``int`` key as a string, so the restored session
    would differ from the original.
    """
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        kind = type(item)
        if item is None or kind in (str, bool, int):
            continue
        if kind is float:
            if item != item or item in (float("inf"), float("-inf")):
                raise NonJsonValue(f"{where} is {item!r}, which JSON cannot carry")
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


def json_copy(value: Any, path: str = "environment") -> Any:
    """A deep copy made through JSON: same key order, no shared objects, JSON values only."""
    check_json(value, path)
    return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False))


def environment_digest(environment: Mapping[str, Any]) -> str:
    """A stable seed for minted IDs: the same task mints the same IDs in every run."""
    canonical = json.dumps(environment, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass
class Session:
    """One seeded environment and the ID counter its tools draw from."""

    environment: dict[str, Any]
    id_seed: str
    next_id: int = 0

    @classmethod
    def seeded(cls, environment: Mapping[str, Any]) -> Session:
        env = json_copy(dict(environment))
        return cls(environment=env, id_seed=environment_digest(env))

    def mint_id(self, prefix: str, taken: Container[str] = ()) -> str:
        """The next ID from the session's counter, skipping any already in ``taken``."""
        for _ in range(MAX_MINT_ATTEMPTS):
            n = self.next_id
            self.next_id += 1
            digest = hashlib.sha256(f"{self.id_seed}:{n}".encode()).hexdigest()[:6].upper()
            candidate = f"{prefix}{digest}"
            if candidate not in taken:
                return candidate
        raise RuntimeError(f"no free {prefix} ID after {MAX_MINT_ATTEMPTS} attempts")


class SessionState(BaseModel):
    """What one session's checkpoint record holds (versioned, strict)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    schema_version: Literal[1]
    environment: dict[str, JsonValue]
    id_seed: str = Field(pattern=ID_SEED_PATTERN)
    next_id: int = Field(ge=0)


def encode_session(session_id: str, session: Session) -> dict[str, Any]:
    """The JSON state of one session; never aliases the live environment."""
    environment = json_copy(session.environment, f"session {session_id}: environment")
    return {
        "schema_version": STATE_SCHEMA_VERSION,
        "environment": environment,
        "id_seed": session.id_seed,
        "next_id": session.next_id,
    }


def decode_session(session_id: str, raw: Any) -> Session:
    """Validate one exported state and build a fresh session from it (raises InvalidState)."""
    if not isinstance(session_id, str) or not session_id:
        raise InvalidState(f"session id {session_id!r} is not a non-empty string")
    try:
        state = SessionState.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)[:5]
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(state)'}: {err['msg']}" for err in errors)
        raise InvalidState(f"session {session_id}: invalid state: {problems}") from None
    environment = json_copy(state.environment, f"session {session_id}: environment")
    return Session(environment=environment, id_seed=state.id_seed, next_id=state.next_id)


class SessionStore:
    """Cookie session id -> session; the three session hooks of an ``exported`` server."""

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
        staged = {sid: decode_session(sid, raw) for sid, raw in states.items()}
        self.sessions.update(staged)

    def retire_session_state(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
