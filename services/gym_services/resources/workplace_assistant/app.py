"""The Workplace Assistant resources server: 27 tools over per-session pandas tables.

Answers like NeMo Gym 0.7.0's workplace_assistant server (FastAPI): ``POST /<tool>`` always answers
``200 {"output":...}`` for a seeded session (tool errors, unknown tools and unexpected arguments are
model-visible text), ``400 {"detail":...}`` for a session never seeded, and FastAPI's ``422`` for a
body that is not a JSON object; bodies are compact JSON as FastAPI writes them. The checkpoint-specific
answers (``409 checkpoint_parked``, ``409 stale_attempt``) are the only deliberate differences.

Declares ``checkpoint_mode = "exported"`` and ``checkpoint_verify = "wait"`` (``/verify`` drops
the session, so it is not replay-safe). Sessions are exported as diffs against the pristine
tables they were seeded from; the pristine base is written once per checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_services.base import nemo_http
from gym_services.base.config import ServerConfig
from gym_services.base.nemo_http import detail_error
from gym_services.base.nemo_responses import CreateParams, ResponseObject, VerifyResponse
from gym_services.base.sessions import session_id
from gym_services.control.admission import RoutePolicy
from gym_services.control.protocol import VerifyMode
from gym_services.resources.common import ExportedParticipant, nemo_routes
from gym_services.server.app import create_server_app, held
from gym_services.server.openapi import Operation

from . import verify as grading
from .sessions import SessionNotFound, StagedSessions, WorkplaceSessions

NOT_SEEDED = "Session not initialized. Please call seed_session first."


class Config(ServerConfig):
    tool_latency_s: float = Field(default=0.0, ge=0, le=60, description="simulated tool latency (demos, tests)")


class VerifyRequest(BaseModel):
    """NeMo Gym's verify request for this server: its two Responses API objects in canonical form, the
    expected actions and the task's identity; other fields are ignored (and not echoed)."""

    model_config = ConfigDict(populate_by_name=True)

    responses_create_params: CreateParams
    rollout_id: str | None = Field(default=None, alias="_ng_rollout_id", exclude=True)
    response: ResponseObject = Field(description="the Responses API response whose function calls are graded")
    ground_truth: list[dict[str, str]] | str = Field(description="the expected actions (text: none)")
    id: int
    category: str
    environment_name: str


class ToolOutput(BaseModel):
    """A tool's answer: its result, or the text of its failure (both for the model)."""

    output: Any


class Unserializable(TypeError):
    """A tool output holds a value JSON cannot carry (FastAPI's pydantic serializer fails on it)."""


def jsonable(value: Any) -> Any:
    """A tool output as FastAPI's response serialization sees it: NaN and infinities become null,
    tuples lists; anything else that is not plain JSON cannot be written."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_json_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    raise Unserializable(f"Unable to serialize unknown type: {type(value)!r}")


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool) or key is None or isinstance(key, (int, float)):
        return json.dumps(key)
    raise Unserializable(f"Unable to serialize unknown type: {type(key)!r}")


def _detail(status: int, detail: Any) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def _json_content(content_type: str | None) -> bool:
    if not content_type:
        return False
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


def request_object(raw: bytes, content_type: str | None) -> dict[str, Any] | JSONResponse:
    """The body as a JSON object, or the answer NeMo Gym's FastAPI gives for one that is not: only a
    JSON content type is parsed (other bodies are validated as text and refused); ``null`` is missing."""
    if not raw:
        return _detail(422, [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}])
    if _json_content(content_type):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            return JSONResponse(nemo_http.json_invalid(exc), status_code=422)
        except (ValueError, RecursionError):  # not in a Unicode encoding JSON allows, or nested past the parser
            return _detail(400, "There was an error parsing the body")
    else:
        data = raw.decode("utf-8", errors="replace")
    if data is None:
        return _detail(422, [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}])
    if not isinstance(data, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        return _detail(422, [{"type": "model_attributes_type", "loc": ["body"], "msg": msg, "input": data}])
    return data


def unencodable_key(body: dict[str, Any]) -> Response | None:
    """NeMo Gym validates a tool body's keys as text: the first key holding a lone surrogate fails as
    ``string_unicode``, and that ``422`` cannot be written as UTF-8, so the answer is the framework's ``500``
    with the encoder's error."""
    for key in body:
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            msg = "Input should be a valid string, unable to parse raw data as a unicode string"
            error = {"type": "string_unicode", "loc": ["body"], "msg": msg, "input": key}
            try:
                return _detail(422, [error])
            except UnicodeEncodeError as exc:
                return nemo_http.repr_error(exc)
    return None


def not_seeded(sid: str) -> Exception:
    return detail_error(400, NOT_SEEDED)


@dataclass(frozen=True)
class Workplace:
    """The server's state, held on ``app.state.held`` for its endpoints."""

    config: Config
    sessions: WorkplaceSessions
    participant: ExportedParticipant[StagedSessions]


async def seed(request: Request) -> JSONResponse:
    server = held(request, Workplace)
    body = request_object(await request.body(), request.headers.get("content-type"))
    if isinstance(body, JSONResponse):
        return body
    await server.participant.seed(request, lambda sid: asyncio.to_thread(server.sessions.seed, sid))
    return JSONResponse({}, headers=server.participant.seed_headers())


async def tool(request: Request) -> Response:
    server = held(request, Workplace)
    name = request.path_params["tool_name"]
    body = request_object(await request.body(), request.headers.get("content-type"))
    if isinstance(body, JSONResponse):
        return body
    refused = unencodable_key(body)
    if refused is not None:
        return refused
    sid, _ = server.participant.session(request, server.sessions.find, missing=not_seeded)
    if server.config.tool_latency_s:
        await asyncio.sleep(server.config.tool_latency_s)
    try:
        result = await asyncio.to_thread(server.sessions.call_tool, sid, name, body)
    except SessionNotFound:  # retired or verified while the call waited
        return _detail(400, NOT_SEEDED)
    try:
        output = jsonable(result)
    except Unserializable as exc:
        return JSONResponse(f"PydanticSerializationError({exc})", status_code=500)
    # pydantic writes the answer, as FastAPI writes the reference's response model: text it cannot encode
    # (a lone surrogate a tool echoes) is its 500 with the error's repr
    return nemo_http.json_response({"output": output})


async def verify(request: Request) -> Response:
    server = held(request, Workplace)
    body = request_object(await request.body(), request.headers.get("content-type"))
    if isinstance(body, JSONResponse):
        return body
    try:
        parsed = nemo_http.validate_body(VerifyRequest, body)
    except nemo_http.NemoHttpError as exc:  # like FastAPI: 422, and the session is kept
        return exc.response()
    sid = session_id(request)
    server.participant.check_session(sid)
    predicted = grading.extract_function_calls(parsed.response.output)
    try:
        correct = await asyncio.to_thread(grading.is_correct, predicted, parsed.ground_truth)
    except Exception as exc:
        return JSONResponse(repr(exc), status_code=500)
    finally:
        server.sessions.drop(sid)  # verify discards the session, even when grading fails
    server.participant.end(sid)
    answer = VerifyResponse(
        responses_create_params=parsed.responses_create_params,
        response=parsed.response,
        reward=1.0 if correct else 0.0,
    )
    return nemo_http.json_response(answer.model_dump(mode="json"))


def create_app(config: Config) -> Starlette:
    sessions = WorkplaceSessions()
    participant = ExportedParticipant(sessions, verify=VerifyMode.WAIT)
    app = create_server_app(
        config,
        participant,
        [
            Route("/seed_session", seed, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
            *nemo_routes.routes(),
            Route("/{tool_name}", tool, methods=["POST"]),
        ],
        policies={path: RoutePolicy.OPEN for path in nemo_routes.PATHS},
        nemo_gym=True,
        api=[
            Operation("POST", "/seed_session", "Start a session on fresh tables", dict[str, Any], dict[str, Any]),
            Operation(
                "POST",
                "/verify",
                "Grade a rollout's function calls against the expected actions",
                VerifyRequest,
                VerifyResponse,
            ),
            *nemo_routes.operations(),
            Operation(
                "POST",
                "/{tool_name}",
                "Call one of the 27 tools on the session's tables",
                dict[str, Any],
                ToolOutput,
                extra_responses={400: "the session was never seeded"},
            ),
        ],
        api_title="workplace_assistant (NeMo Gym 0.7.0 resources server)",
    )
    app.state.held = Workplace(config, sessions, participant)
    app.state.workplace_sessions = sessions  # the conformance suite reads the final tables
    return app
