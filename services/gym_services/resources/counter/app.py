"""An example resources server small enough to show the whole checkpoint contract.

Each session holds one integer. ``/seed_session`` sets it, ``/increment`` changes it,
``/verify`` rewards reaching a target and drops the session. It declares
``checkpoint_mode = "exported"`` and implements the three session hooks; later
servers follow the same pattern with richer state.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.server.app import create_server_app
from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body
from gym_services.base.sessions import session_id
from gym_services.control.participant import InvalidState
from gym_services.resources.common.sessions import ResourcesParticipant

STATE_VERSION = 1


class Config(ServerConfig):
    max_value: int = Field(default=1_000_000, description="increments beyond this are refused as tool errors")
    checkpoint_mode: Literal["exported", "restart_only"] = Field(
        default="exported", description="restart_only: live sessions block a checkpoint instead of being saved"
    )


class SeedRequest(BaseModel):
    start: int = 0


class IncrementRequest(BaseModel):
    by: int = 1


class VerifyRequest(BaseModel):
    target: int


class CounterSessions:
    """Session id -> counter; the three session hooks of an ``exported`` server."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def export_session_states(self) -> dict[str, Any]:
        return {sid: {"version": STATE_VERSION, "value": value} for sid, value in self.values.items()}

    def restore_session_states(self, states: dict[str, Any]) -> None:
        staged: dict[str, int] = {}
        for sid, state in states.items():
            if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
                raise InvalidState(f"session {sid}: unsupported state version")
            value = state.get("value")
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidState(f"session {sid}: value must be an integer")
            staged[sid] = value
        self.values.update(staged)  # only after every state passed

    def retire_session_state(self, session_id: str) -> None:
        self.values.pop(session_id, None)


def create_app(config: Config) -> Starlette:
    store = CounterSessions()
    participant = ResourcesParticipant(store, mode=config.checkpoint_mode, verify="wait")

    def current(request: Request) -> str:
        sid = session_id(request)
        participant.check_session(sid)
        if sid not in store.values:
            raise ApiError(ErrorCode.SESSION_NOT_FOUND, f"session {sid} is unknown; call /seed_session first")
        return sid

    async def seed(request: Request) -> JSONResponse:
        body = await parse_body(request, SeedRequest)
        sid = session_id(request)
        store.values[sid] = body.start
        participant.seeded(sid, request.headers)
        return JSONResponse({"session_id": sid, "value": body.start}, headers=participant.seed_headers())

    async def increment(request: Request) -> JSONResponse:
        body = await parse_body(request, IncrementRequest)
        sid = current(request)
        new = store.values[sid] + body.by
        if abs(new) > config.max_value:
            return JSONResponse({"output": f"Error: value {new} is out of range"})
        store.values[sid] = new
        return JSONResponse({"output": new})

    async def verify(request: Request) -> JSONResponse:
        body = await parse_body(request, VerifyRequest)
        sid = current(request)
        try:
            value = store.values[sid]
            reward = 1.0 if value == body.target else 0.0
        finally:
            store.values.pop(sid, None)  # verify drops the session, so it is not replay-safe
        participant.end(sid)
        return JSONResponse({"reward": reward, "value": value})

    return create_server_app(
        config,
        participant,
        [
            Route("/seed_session", seed, methods=["POST"]),
            Route("/increment", increment, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
        ],
    )
