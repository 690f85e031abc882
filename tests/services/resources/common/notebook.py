"""A small key-value notebook, a stateful server as a new author writes one: its mode is whatever it declares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.support.asgi import base_config

from gym_services.base.config import ServerConfig, load_config
from gym_services.control.participant import InvalidState
from gym_services.control.protocol import CheckpointMode
from gym_services.resources.common import SessionParticipant, participant_for
from gym_services.server.app import create_server_app, held


class Notebook:
    """Session id -> its notes; the session hooks of an ``exported`` server."""

    def __init__(self) -> None:
        self.notes: dict[str, dict[str, str]] = {}

    def export_session_states(self) -> dict[str, object]:
        return {sid: dict(notes) for sid, notes in self.notes.items()}

    def stage_session_states(self, states: Mapping[str, object]) -> dict[str, dict[str, str]]:
        staged = {}
        for sid, state in states.items():
            if not isinstance(state, dict):
                raise InvalidState(f"session {sid}: notes must be an object")
            staged[sid] = {str(k): str(v) for k, v in state.items()}
        return staged

    def install_session_states(self, staged: dict[str, dict[str, str]]) -> None:
        self.notes.update(staged)

    def retire_session_state(self, session_id: str) -> None:
        self.notes.pop(session_id, None)


class Held:
    def __init__(self, notebook: Notebook, participant: SessionParticipant[Any, Any]) -> None:
        self.notebook = notebook
        self.participant = participant


async def seed(request: Request) -> JSONResponse:
    server = held(request, Held)
    sid = await server.participant.seed(request, lambda sid: server.notebook.notes.__setitem__(sid, {}))
    return JSONResponse({"session_id": sid}, headers=server.participant.seed_headers())


async def put(request: Request) -> JSONResponse:
    server = held(request, Held)
    body = await request.json()
    _, notes = server.participant.session(request, server.notebook.notes.get)
    notes[body["key"]] = body["value"]
    return JSONResponse({"keys": sorted(notes)})


async def get(request: Request) -> JSONResponse:
    server = held(request, Held)
    body = await request.json()
    _, notes = server.participant.session(request, server.notebook.notes.get)
    return JSONResponse({"value": notes.get(body["key"])})


def notebook_app(mode: CheckpointMode = CheckpointMode.EXPORTED, name: str = "notebook") -> Starlette:
    notebook = Notebook()
    participant = participant_for(mode, notebook)
    config = load_config(ServerConfig, overrides=base_config(name))
    app = create_server_app(
        config,
        participant,
        [
            Route("/seed_session", seed, methods=["POST"]),
            Route("/put", put, methods=["POST"]),
            Route("/get", get, methods=["POST"]),
        ],
    )
    app.state.held = Held(notebook, participant)
    return app
