"""math_formal_lean: checks a model's Lean 4 proof in a Lean sandbox (see the README).

Answers like NeMo Gym 0.7.0's ``math_formal_lean`` server: the same request model (the task's
``header`` and ``formal_statement``, ``responses_create_params`` and ``response`` validated as NeMo
Gym validates them, optional ``informal_prefix``, ``name``, ``turn_index``; FastAPI's ``422``
otherwise), the same proof extraction, sandbox request and reading of the sandbox's answer, the
same feedback, correction prompt and reward, and the same response body (the request's
``responses_create_params`` and ``response`` echoed in NeMo Gym's canonical form). Where the
reference fails on a malformed sandbox answer, ``/verify`` answers ``500`` with the error's repr
as NeMo Gym's server does.

The server keeps no session state: ``/verify`` answers from the request and the compiler output
alone, so it declares ``checkpoint_mode = "stateless"`` (a checkpoint holds no records) and
``checkpoint_verify = "replay"`` (running a verification again after a crash is safe), advertises
``replay`` in the ``x-ng-checkpoint-verify`` header of ``/seed_session``, and keeps serving
``/verify`` while a checkpoint is open.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gym_services.base.config import ServerConfig
from gym_services.base.metrics import Metrics
from gym_services.base.nemo_http import (
    NemoHttpError,
    json_response,
    missing_body,
    parse,
    read_body,
    repr_error,
)
from gym_services.base.nemo_responses import CreateParams, ResponseObject, UnreadableOutput
from gym_services.control.admission import RoutePolicy
from gym_services.control.protocol import VerifyMode
from gym_services.resources.common import StatelessParticipant, nemo_routes
from gym_services.resources.common.nemo_routes import EpisodeId, TaskId
from gym_services.resources.math_formal_lean import feedback, proof
from gym_services.resources.math_formal_lean.sandbox_client import LeanSandbox
from gym_services.server.app import create_server_app, held
from gym_services.server.openapi import Operation

LOG = logging.getLogger(__name__)


def _env_default(name: str, fallback: str) -> str:
    return os.environ.get(name) or fallback


class Config(ServerConfig):
    sandbox_host: str = Field(
        default_factory=lambda: _env_default("NEMO_SKILLS_SANDBOX_HOST", "127.0.0.1"),
        description="Lean sandbox host (NEMO_SKILLS_SANDBOX_HOST when unset)",
    )
    sandbox_port: int = Field(
        default_factory=lambda: int(_env_default("NEMO_SKILLS_SANDBOX_PORT", "6000")),
        ge=1,
        le=65535,
        description="Lean sandbox port (NEMO_SKILLS_SANDBOX_PORT when unset)",
    )
    compilation_timeout: float = Field(default=30.0, gt=0, le=3600, description="seconds the sandbox may compile")
    sandbox_timeout_margin_s: float = Field(
        default=5.0, ge=0, le=600, description="the HTTP call waits compilation_timeout + this"
    )
    sandbox_max_connections: int = Field(default=100, ge=1, le=10_000)
    max_output_characters: int = Field(default=1000, ge=1, description="compiler output the sandbox returns")
    extract_code_mode: Literal["last", "first"] = "last"
    restate_formal_statement: bool = Field(default=True, description="compile the task's statement, not the model's")
    strip_theorem_from_proof: bool = Field(default=True, description="keep only the proof after := / by")
    refinement_prompt_template: str | None = Field(
        default=None,
        description="str.format template with {proof_attempt} and {error_message}; "
        "default: NeMo Gym's refinement prompt",
    )

    @field_validator("refinement_prompt_template")
    @classmethod
    def _template_formats(cls, value: str | None) -> str | None:
        if value is not None:
            feedback.check_template(value)
        return value


class VerifyRequest(BaseModel):
    """NeMo Gym's verify body for this server; other fields are ignored (and not echoed)."""

    model_config = ConfigDict(populate_by_name=True)

    responses_create_params: CreateParams
    rollout_id: str | None = Field(default=None, alias="_ng_rollout_id", exclude=True)
    response: ResponseObject
    header: str
    formal_statement: str
    informal_prefix: str | None = None
    name: str | None = None
    turn_index: int = 0


NOT_AN_OBJECT = "Input should be a valid dictionary or object to extract fields from"


class SeedSessionRequest(BaseModel):
    """An environment server's seed; any other object is an agent's seed."""

    model_config = ConfigDict(extra="forbid")

    resources_session_id: str = Field(min_length=1)
    episode_id: EpisodeId
    task_id: TaskId
    task_data: dict[str, Any]


class SeedSessionAnswer(BaseModel):
    """An environment server's seed answer (an agent's seed is answered ``{}``)."""

    resources_session_id: str
    resources_tools: Any = None
    sandbox_access: Any = None


class CompilerOutput(BaseModel):
    process_status: str
    stdout: str
    stderr: str


class VerifyResponse(BaseModel):
    responses_create_params: CreateParams
    response: ResponseObject
    reward: float
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None
    proof_status: str
    predicted_proof: str
    compiler_output: CompilerOutput | None = None
    turn_index: int = 0
    needs_correction: bool = False
    error_feedback: str | None = None
    correction_prompt: str | None = None


@dataclass(frozen=True)
class LeanMetrics:
    verifications: Counter

    @classmethod
    def declare(cls, metrics: Metrics) -> LeanMetrics:
        return cls(metrics.counter("gym_lean_verifications", "Lean verifications by proof status", ("proof_status",)))


class Verifier:
    """The ``/verify`` logic, independent of HTTP so tests can call it directly."""

    def __init__(self, config: Config, sandbox: LeanSandbox) -> None:
        self.config = config
        self.sandbox = sandbox

    async def verify(self, req: VerifyRequest) -> VerifyResponse:
        """Raises where NeMo Gym's server raises (a sandbox answer that is not a compiler output)."""
        cfg = self.config
        echo = {
            "responses_create_params": req.responses_create_params,
            "response": req.response,
            "turn_index": req.turn_index,
        }
        generation = req.response.output_text()
        if not generation or not generation.strip():
            LOG.warning("empty generation at turn %d", req.turn_index)
            message = feedback.EMPTY_GENERATION_FEEDBACK
            prompt = feedback.correction_prompt(
                cfg.refinement_prompt_template, proof_attempt=feedback.EMPTY_ATTEMPT, error_message=message
            )
            return VerifyResponse(
                **echo,
                reward=0.0,
                proof_status="empty_generation",
                predicted_proof="",
                needs_correction=True,
                error_feedback=message,
                correction_prompt=prompt,
            )
        code = proof.build_code(
            generation,
            req.header,
            req.formal_statement,
            mode=cfg.extract_code_mode,
            restate_formal_statement=cfg.restate_formal_statement,
            strip_theorem_from_proof=cfg.strip_theorem_from_proof,
        )
        output = await self.sandbox.execute(code, timeout_s=cfg.compilation_timeout)
        status = feedback.proof_status(output)
        if status == "completed":
            return VerifyResponse(
                **echo,
                reward=1.0,
                proof_status=status,
                predicted_proof=code,
                compiler_output=CompilerOutput(**output),
                needs_correction=False,
            )
        message = feedback.error_feedback(output, code)
        prompt = feedback.correction_prompt(
            cfg.refinement_prompt_template, proof_attempt=generation, error_message=message
        )
        return VerifyResponse(
            **echo,
            reward=0.0,
            proof_status=status,
            predicted_proof=code,
            compiler_output=CompilerOutput(**output),
            needs_correction=True,
            error_feedback=message,
            correction_prompt=prompt,
        )


@dataclass(frozen=True)
class Lean:
    """The server's state, held on ``app.state.held`` for its endpoints."""

    participant: StatelessParticipant
    verifier: Verifier
    counts: LeanMetrics


async def seed(request: Request) -> Response:
    """An agent's seed (the task row; nothing of it is kept) answers ``{}``; an environment
    server's seed (``resources_session_id``, ``episode_id``, ...) gets its session id back."""
    participant = held(request, Lean).participant
    body = await read_body(request)
    if body is None:
        raise missing_body()
    if not isinstance(body, dict):
        shown = body.decode() if isinstance(body, bytes) else body
        raise NemoHttpError(
            422,
            {
                "detail": [
                    {"type": "model_attributes_type", "loc": ["body", form], "msg": NOT_AN_OBJECT, "input": shown}
                    for form in ("ResourcesSeedSessionRequest", "BaseSeedSessionRequest")
                ]
            },
        )
    try:
        seeded = SeedSessionRequest.model_validate(body)
    except ValidationError:
        return json_response({}, headers=participant.seed_headers())
    answer = {"resources_session_id": seeded.resources_session_id, "resources_tools": None, "sandbox_access": None}
    return json_response(answer, headers=participant.seed_headers())


async def verify(request: Request) -> Response:
    server = held(request, Lean)
    body = await parse(request, VerifyRequest)
    try:
        result = await server.verifier.verify(body)
    except Exception as exc:
        # e.g. a sandbox answer that is JSON but not a compiler output, on which the reference fails too
        LOG.exception("verification failed: %r", exc)
        server.counts.verifications.labels(proof_status="server_error").inc()
        return repr_error(AttributeError(*exc.args) if isinstance(exc, UnreadableOutput) else exc)
    server.counts.verifications.labels(proof_status=result.proof_status).inc()
    return json_response(result.model_dump(mode="json"))


def create_app(config: Config, *, sandbox_transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """``sandbox_transport`` lets tests and the demo run the sandbox stand-in in process."""
    participant = StatelessParticipant(verify=VerifyMode.REPLAY)
    metrics = Metrics(config.name)
    counts = LeanMetrics.declare(metrics)
    sandbox = LeanSandbox(
        config.sandbox_host,
        config.sandbox_port,
        max_output_characters=config.max_output_characters,
        timeout_margin_s=config.sandbox_timeout_margin_s,
        max_connections=config.sandbox_max_connections,
        transport=sandbox_transport,
    )
    verifier = Verifier(config, sandbox)
    app = create_server_app(
        config,
        participant,
        [
            Route("/seed_session", seed, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
            *nemo_routes.routes(),
        ],
        # Nothing here holds state: every route keeps serving while a checkpoint is open.
        policies={path: RoutePolicy.OPEN for path in ("/verify", "/seed_session", "/close_session", "/reverify_mode")},
        on_shutdown=[sandbox.aclose],
        nemo_gym=True,
        metrics=metrics,
        api=[
            Operation(
                "POST",
                "/seed_session",
                "Seed an environment-server session (or accept an agent's seed)",
                SeedSessionRequest | dict[str, Any],
                SeedSessionAnswer | dict[str, Any],
            ),
            Operation(
                "POST", "/verify", "Compile the proof in the sandbox and grade it", VerifyRequest, VerifyResponse
            ),
            *nemo_routes.operations(),
        ],
        api_title="math_formal_lean (NeMo Gym 0.7.0 resources server)",
    )
    app.state.held = Lean(participant, verifier, counts)
    app.state.verifier = verifier
    return app
