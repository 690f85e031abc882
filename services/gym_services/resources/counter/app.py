"""An example resources server small enough to show the whole checkpoint contract.

Each session holds one integer. ``/seed_session`` sets it, ``/increment`` changes it,
``/verify`` rewards reaching a target and drops the session. It is ``exported`` (its
store implements the session hooks of :mod:`gym_services.resources.common.hooks`) unless
configured ``restart_only``; later servers follow the same pattern with richer state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.base.config import ServerConfig
from gym_services.base.http import parse_body
from gym_services.control.participant import F, InvalidState, V
from gym_services.control.protocol import CheckpointMode, VerifyMode
from gym_services.resources.common import ExportedParticipant, RestartOnlyParticipant, SessionParticipant
from gym_services.server.app import create_server_app, held

STATE_VERSION = 1


class Config(ServerConfig):
    max_value: int = Field(default=1_000_000, description="increments beyond this are refused as tool errors")
    checkpoint_mode: Literal[CheckpointMode.EXPORTED, CheckpointMode.RESTART_ONLY] = Field(
        default=CheckpointMode.EXPORTED,
        description="restart_only: live sessions block a checkpoint instead of being saved",
    )


class SeedRequest(BaseModel):
    start: int = 0


class IncrementRequest(BaseModel):
    by: int = 1


class VerifyRequest(BaseModel):
    target: int


class CounterSessions:
    """Session id -> counter; the session hooks of an ``exported`` server."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def seed(self, session_id: str, value: int) -> None:
        self.values[session_id] = value

    def export_session_states(self) -> dict[str, Any]:
        return {sid: {"version": STATE_VERSION, "value": value} for sid, value in self.values.items()}

    def stage_session_states(self, states: Mapping[str, object]) -> dict[str, int]:
        staged: dict[str, int] = {}
        for sid, state in states.items():
            if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
                raise InvalidState(f"session {sid}: unsupported state version")
            value = state.get("value")
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidState(f"session {sid}: value must be an integer")
            staged[sid] = value
        return staged

    def install_session_states(self, staged: dict[str, int]) -> None:
        self.values.update(staged)

    def retire_session_state(self, session_id: str) -> None:
        self.values.pop(session_id, None)


@dataclass(frozen=True)
class Counter:
    """The server's state, held on ``app.state.held`` for its endpoints."""

    config: Config
    store: CounterSessions
    participant: SessionParticipant[Any, Any]


async def seed(request: Request) -> JSONResponse:
    server = held(request, Counter)
    body = await parse_body(request, SeedRequest)
    sid = await server.participant.seed(request, lambda sid: server.store.seed(sid, body.start))
    return JSONResponse({"session_id": sid, "value": body.start}, headers=server.participant.seed_headers())


async def increment(request: Request) -> JSONResponse:
    server = held(request, Counter)
    body = await parse_body(request, IncrementRequest)
    sid, value = server.participant.session(request, server.store.values.get)
    new = value + body.by
    if abs(new) > server.config.max_value:
        return JSONResponse({"output": f"Error: value {new} is out of range"})
    server.store.values[sid] = new
    return JSONResponse({"output": new})


async def verify(request: Request) -> JSONResponse:
    server = held(request, Counter)
    body = await parse_body(request, VerifyRequest)
    sid, value = server.participant.session(request, server.store.values.get)
    try:
        reward = 1.0 if value == body.target else 0.0
    finally:
        server.store.values.pop(sid, None)  # verify drops the session, so it is not replay-safe
    server.participant.end(sid)
    return JSONResponse({"reward": reward, "value": value})


def create_app(config: Config) -> Starlette:
    store = CounterSessions()
    if config.checkpoint_mode is CheckpointMode.RESTART_ONLY:
        return _app(config, store, RestartOnlyParticipant(store, verify=VerifyMode.WAIT))
    return _app(config, store, ExportedParticipant(store, verify=VerifyMode.WAIT))


def _app(config: Config, store: CounterSessions, participant: SessionParticipant[V, F]) -> Starlette:
    """The counter's routes over ``store``, with ``participant`` (of the configured mode) taking part."""
    app = create_server_app(
        config,
        participant,
        [
            Route("/seed_session", seed, methods=["POST"]),
            Route("/increment", increment, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
        ],
    )
    app.state.held = Counter(config, store, participant)
    return app
