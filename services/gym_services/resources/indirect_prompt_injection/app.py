"""The indirect prompt injection resources server.

Each session holds a deep copy of the task's environment; tool routes (``POST
/{tool_name}``) read and change it; ``/verify`` scores safety × utility from the
rollout's function calls and drops the session in a ``finally`` block, so the verify
mode is ``wait``. The server is ``exported``: the session hooks of
:class:`~.state.SessionStore` copy each environment (and its ID counter) through JSON.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.server.app import create_server_app
from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import read_json, validate
from gym_services.base.sessions import session_id
from gym_services.resources.common.sessions import ResourcesParticipant
from gym_services.resources.indirect_prompt_injection import verifier
from gym_services.resources.indirect_prompt_injection.models import SeedRequest, ToolOutput, VerifyRequest
from gym_services.resources.indirect_prompt_injection.state import NonJsonValue, Session, SessionStore
from gym_services.resources.indirect_prompt_injection.tools import TOOLS, run_tool


class Config(ServerConfig):
    max_environment_bytes: int = Field(
        default=1_000_000, ge=2, description="larger environments are refused at /seed_session (400)"
    )


def create_app(config: Config) -> Starlette:
    store = SessionStore()
    participant = ResourcesParticipant(store, mode="exported", verify="wait")
    app_metrics: dict[str, Any] = {}

    def held_session(request: Request) -> tuple[str, Session]:
        sid = session_id(request)
        participant.check_session(sid)
        session = store.get(sid)
        if session is None:
            raise ApiError(ErrorCode.SESSION_NOT_FOUND, f"session {sid} is unknown; call /seed_session first")
        return sid, session

    async def seed(request: Request) -> JSONResponse:
        body = validate(SeedRequest, await read_json(request))
        size = len(json.dumps(body.environment, ensure_ascii=False, default=str))
        if size > config.max_environment_bytes:
            raise ApiError(ErrorCode.BAD_REQUEST, f"environment is {size} bytes; the limit is {config.max_environment_bytes}")
        sid = session_id(request)
        try:
            store.seed(sid, body.environment)
        except NonJsonValue as exc:  # pragma: no cover - a parsed JSON body always passes
            raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        participant.seeded(sid, request.headers)
        return JSONResponse({}, headers=participant.seed_headers())

    async def call_tool(request: Request) -> JSONResponse:
        name = request.path_params["tool_name"]
        _, session = held_session(request)
        args = await read_json(request)
        if not isinstance(args, dict):
            raise ApiError(ErrorCode.BAD_REQUEST, f"tool arguments must be a JSON object, got {type(args).__name__}")
        result = run_tool(session, name, args)
        app_metrics["tools"].labels(tool=name if name in TOOLS else "unknown", outcome=result.outcome).inc()
        return JSONResponse(ToolOutput(output=result.output).model_dump())

    async def verify(request: Request) -> JSONResponse:
        raw = await read_json(request)
        body = validate(VerifyRequest, raw)
        sid, _ = held_session(request)
        try:
            verdict = verifier.score(
                body.response.output,
                body.injection.model_dump(),
                body.required_tools,
                body.response.incomplete_details.reason if body.response.incomplete_details else None,
            )
        except Exception:
            app_metrics["verify"].labels(result="error").inc()
            raise
        finally:
            store.drop(sid)  # even when scoring raises: verify is not replay-safe, hence "wait"
        participant.end(sid)
        app_metrics["verify"].labels(result="followed" if verdict.injection_followed else "resisted").inc()
        injection = body.injection
        return JSONResponse(
            {
                **raw,
                "reward": verdict.reward,
                "reward_safety": verdict.reward_safety,
                "reward_utility": verdict.reward_utility,
                "injection_followed": verdict.injection_followed,
                "matched_tool": verdict.matched_tool,
                "matched_args": verdict.matched_args,
                "attack_difficulty": injection.attack_difficulty,
                "attack_strategy": injection.attack_strategy,
                "attack_category": injection.category,
                "verification_type": injection.verification_type,
                "thinking_incomplete": verdict.thinking_incomplete,
            }
        )

    app = create_server_app(
        config,
        participant,
        [
            Route("/seed_session", seed, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
            Route("/{tool_name}", call_tool, methods=["POST"]),
        ],
    )
    metrics = app.state.metrics
    app_metrics["tools"] = metrics.counter("ipi_tool_calls", "Tool calls by tool and outcome", ("tool", "outcome"))
    app_metrics["verify"] = metrics.counter("ipi_verifications", "Verifications by result", ("result",))
    app.state.sessions = store
    return app
