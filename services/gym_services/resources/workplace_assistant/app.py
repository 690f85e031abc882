"""The Workplace Assistant resources server: 27 tools over per-session pandas tables.

Declares ``checkpoint_mode = "exported"`` and ``checkpoint_verify = "wait"`` (``/verify`` drops
the session, so it is not replay-safe). Sessions are exported as diffs against the pristine
tables they were seeded from; the pristine base is written once per checkpoint.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_services.server.app import create_server_app
from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body, read_json, read_json_object
from gym_services.base.sessions import session_id
from gym_services.resources.common.sessions import ResourcesParticipant

from .sessions import SessionNotFound, WorkplaceSessions
from .tools import tool_schemas, tool_specs
from . import verify as grading


class Config(ServerConfig):
    tool_latency_s: float = Field(default=0.0, ge=0, le=60, description="simulated tool latency (demos, tests)")


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    response: dict[str, Any] = Field(description="the Responses API response whose function calls are graded")
    ground_truth: list[dict[str, Any]] | str | None = None


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()  # numpy scalars
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _output(value: object) -> Response:
    """Tool output as stored, key order kept."""
    body = json.dumps({"output": value}, ensure_ascii=False, default=_json_default)
    return Response(body, media_type="application/json")


def create_app(config: Config) -> Starlette:
    sessions = WorkplaceSessions()
    participant = ResourcesParticipant(sessions, mode="exported", verify="wait")
    specs = tool_specs()

    def live_session(request: Request) -> str:
        sid = session_id(request)
        participant.check_session(sid)
        if sid not in sessions:
            raise ApiError(ErrorCode.SESSION_NOT_FOUND, f"session {sid} is not initialized; call /seed_session first")
        return sid

    async def seed(request: Request) -> JSONResponse:
        await read_json_object(request)  # the body is unused, but must be a JSON object
        sid = session_id(request)
        await asyncio.to_thread(sessions.seed, sid)
        participant.seeded(sid, request.headers)
        return JSONResponse({"session_id": sid}, headers=participant.seed_headers())

    async def tools(request: Request) -> JSONResponse:
        return JSONResponse({"tools": tool_schemas()})

    async def tool(request: Request) -> Response:
        name = request.path_params["tool_name"]
        if name not in specs:
            raise ApiError(ErrorCode.NOT_FOUND, f"no tool {name!r}; GET /tools lists the {len(specs)} tools")
        arguments = await read_json(request)
        sid = live_session(request)
        if config.tool_latency_s:
            await asyncio.sleep(config.tool_latency_s)
        try:
            result = await asyncio.to_thread(sessions.call_tool, sid, name, arguments)
        except SessionNotFound:
            raise ApiError(ErrorCode.SESSION_NOT_FOUND, f"session {sid} is not initialized; call /seed_session first") from None
        return _output(result)

    async def verify(request: Request) -> JSONResponse:
        body = await parse_body(request, VerifyRequest)
        sid = live_session(request)
        output = body.response.get("output", [])
        try:
            if not isinstance(output, list):
                raise ValueError("response.output must be a list of items")
            predicted = grading.extract_function_calls(output)
            expected = grading.parse_actions(body.ground_truth)
        except ValueError as exc:  # bad input: refused, and the session is kept
            raise ApiError(ErrorCode.BAD_REQUEST, f"cannot grade this request: {exc}") from None
        try:
            correct = await asyncio.to_thread(grading.is_correct, predicted, expected)
        finally:
            sessions.drop(sid)  # verify discards the session even when it raises
        participant.end(sid)
        return JSONResponse({**body.model_dump(), "reward": 1.0 if correct else 0.0})

    app = create_server_app(
        config,
        participant,
        [
            Route("/seed_session", seed, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
            Route("/tools", tools, methods=["GET"]),
            Route("/{tool_name}", tool, methods=["POST"]),
        ],
    )
    app.state.workplace_sessions = sessions  # the conformance suite reads the final tables
    return app
