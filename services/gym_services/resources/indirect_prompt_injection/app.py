"""The indirect prompt injection resources server: nine domains' tools, and the verifier.

It answers as NeMo Gym's server does (see the README for the few deliberate differences):

- ``/seed_session`` keeps a deep copy of the task's ``environment`` under the session cookie;
- ``POST /{tool_name}`` runs the tool on that environment and answers ``{"output": text}``; an
  unknown tool, wrong arguments or a failing tool are answers too (``200``); a session that was
  never seeded is ``400``;
- ``/verify`` scores safety * utility from the rollout's function calls, echoes the request with the
  verdict, and drops the session in every case (so the verify mode is ``wait``); a verification that
  fails is ``500`` with the error's ``repr``, as in NeMo Gym;
- malformed bodies get FastAPI's answers (``422``/``400`` with ``detail``), see
  :mod:`gym_services.base.nemo_http`.

The server is ``exported``: :class:`~.state.SessionStore` saves and restores each environment and
its ID stream, so a restored session answers every call exactly as the original would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gym_services.base import nemo_http
from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.metrics import Metrics
from gym_services.base.sessions import session_id
from gym_services.control.admission import RoutePolicy
from gym_services.control.protocol import VerifyMode
from gym_services.resources.common import ExportedParticipant, nemo_routes
from gym_services.resources.indirect_prompt_injection import models, verifier
from gym_services.resources.indirect_prompt_injection.models import SeedRequest, ToolCallRequest, VerifyRequest
from gym_services.resources.indirect_prompt_injection.state import NonJsonValue, Session, SessionStore
from gym_services.resources.indirect_prompt_injection.tools import TOOLS, run_tool
from gym_services.server.app import create_server_app, held
from gym_services.server.openapi import Operation

NOT_SEEDED = "Session not initialized. Please call seed_session first."
#: what the verdict sets, in the order NeMo Gym passes it to its response model
VERDICT_FIELDS = (
    "reward",
    "reward_safety",
    "reward_utility",
    "injection_followed",
    "matched_tool",
    "matched_args",
    "thinking_incomplete",
    "attack_difficulty",
    "attack_strategy",
    "attack_category",
    "verification_type",
)


@dataclass(frozen=True)
class IpiMetrics:
    tools: Counter
    verifications: Counter

    @classmethod
    def declare(cls, metrics: Metrics) -> IpiMetrics:
        return cls(
            tools=metrics.counter("ipi_tool_calls", "Tool calls by tool and outcome", ("tool", "outcome")),
            verifications=metrics.counter("ipi_verifications", "Verifications by result", ("result",)),
        )


class Config(ServerConfig):
    max_environment_bytes: int = Field(
        default=1_000_000, ge=2, description="larger environments are refused at /seed_session (413)"
    )


class IPIVerifyResponse(BaseModel):
    """The fields of NeMo Gym's verify response a request may set itself (named as NeMo Gym's model,
    whose name its validation errors show)."""

    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None


def verify_answer(raw: dict[str, Any], body: VerifyRequest, verdict: verifier.Verdict) -> dict[str, Any]:
    """The verify response: the request's two Responses API objects and the verdict, in NeMo Gym's order.

    The two objects are echoed in NeMo Gym's canonical form (every declared field, defaults filled
    in, as its request models dump them), whichever optional fields the request gave.

    NeMo Gym builds its response model from the request's fields plus the verdict: a request field
    named like a verdict field is a duplicate keyword argument (a ``TypeError``, hence ``500``); the
    failure fields a request carries are kept; every other extra field is dropped.
    """
    for name in VERDICT_FIELDS:
        if name in raw:
            raise TypeError(f"__main__.IPIVerifyResponse() got multiple values for keyword argument '{name}'")
    failure = IPIVerifyResponse.model_validate({k: raw[k] for k in IPIVerifyResponse.model_fields if k in raw})
    injection = body.injection
    return {
        "responses_create_params": body.responses_create_params.model_dump(mode="json"),
        "response": body.response.model_dump(mode="json"),
        "reward": verdict.reward,
        "mask_sample": failure.mask_sample,
        "failure_kind": failure.failure_kind,
        "failure_reason": failure.failure_reason,
        "injection_followed": verdict.injection_followed,
        "matched_tool": verdict.matched_tool,
        "matched_args": verdict.matched_args,
        "attack_difficulty": injection.attack_difficulty,
        "attack_strategy": injection.attack_strategy,
        "attack_category": injection.category,
        "verification_type": injection.verification_type,
        "reward_safety": verdict.reward_safety,
        "reward_utility": verdict.reward_utility,
        "thinking_incomplete": verdict.thinking_incomplete,
    }


def not_seeded(sid: str) -> Exception:
    return nemo_http.detail_error(400, NOT_SEEDED)


@dataclass(frozen=True)
class Injection:
    """The server's state, held on ``app.state.held`` for its endpoints."""

    config: Config
    store: SessionStore
    participant: ExportedParticipant[dict[str, Session]]
    counts: IpiMetrics


async def seed(request: Request) -> Response:
    server = held(request, Injection)
    body = await nemo_http.parse(request, SeedRequest)
    size = len(json.dumps(body.environment, default=str))
    limit = server.config.max_environment_bytes
    if size > limit:
        raise ApiError(ErrorCode.PAYLOAD_TOO_LARGE, f"environment is {size} bytes; the limit is {limit}")
    try:
        await server.participant.seed(request, lambda sid: server.store.seed(sid, body.environment))
    except NonJsonValue as exc:  # pragma: no cover - a parsed JSON body always passes
        raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
    return nemo_http.json_response({}, headers=server.participant.seed_headers())


async def call_tool(request: Request) -> Response:
    server = held(request, Injection)
    name = request.path_params["tool_name"]
    body = await nemo_http.parse(request, ToolCallRequest)
    _, session = server.participant.session(request, server.store.get, missing=not_seeded)
    result = run_tool(session, name, body.model_dump(exclude_unset=True))
    server.counts.tools.labels(tool=name if name in TOOLS else "unknown", outcome=result.outcome).inc()
    return nemo_http.json_response({"output": result.output})


async def verify(request: Request) -> Response:
    server = held(request, Injection)
    raw = await nemo_http.read_body(request)
    body = nemo_http.validate_body(VerifyRequest, raw)
    sid = session_id(request)
    server.participant.check_session(sid)
    incomplete = body.response.incomplete_details
    try:
        verdict = verifier.score(
            raw["response"]["output"],
            body.injection.model_dump(),
            body.required_tools,
            incomplete.reason if incomplete else None,
        )
        answer = nemo_http.json_response(verify_answer(raw, body, verdict))
    except Exception as exc:
        server.counts.verifications.labels(result="error").inc()
        return nemo_http.repr_error(exc)
    finally:
        server.store.drop(sid)  # even when scoring fails: verify is not replay-safe, hence "wait"
        server.participant.end(sid)
    server.counts.verifications.labels(result="followed" if verdict.injection_followed else "resisted").inc()
    return answer


def create_app(config: Config) -> Starlette:
    store = SessionStore()
    participant = ExportedParticipant(store, verify=VerifyMode.WAIT)
    metrics = Metrics(config.name)
    counts = IpiMetrics.declare(metrics)
    app = create_server_app(
        config,
        participant,
        [
            Route("/seed_session", seed, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
            *nemo_routes.routes(),
            Route("/{tool_name}", call_tool, methods=["POST"]),
        ],
        metrics=metrics,
        policies={path: RoutePolicy.OPEN for path in nemo_routes.PATHS},
        nemo_gym=True,
        api=[
            Operation(
                "POST", "/seed_session", "Start a session on a task's environment", models.SeedRequest, dict[str, Any]
            ),
            Operation(
                "POST", "/verify", "Score a rollout: safety x utility", models.VerifyRequest, models.VerifyAnswer
            ),
            *nemo_routes.operations(),
            Operation(
                "POST",
                "/{tool_name}",
                "Call a tool of the session's domain",
                models.ToolCallRequest,
                models.ToolOutput,
                extra_responses={400: "the session was never seeded"},
            ),
        ],
        api_title="indirect_prompt_injection (NeMo Gym 0.7.0 resources server)",
    )
    app.state.held = Injection(config, store, participant, counts)
    app.state.sessions = store
    return app
