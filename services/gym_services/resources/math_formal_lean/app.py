"""math_formal_lean: checks a model's Lean 4 proof in a Lean sandbox (REFERENCE B.3).

The server keeps no session state: ``/verify`` builds header + formal statement + proof
from its request, compiles it with the sandbox's stateless ``/execute``, and answers from
the request and the compiler output alone. So it declares ``checkpoint_mode =
"stateless"`` (commit writes no records) and ``checkpoint_verify = "replay"`` (running a
verification again after a crash is safe), advertises ``replay`` in the
``x-ng-checkpoint-verify`` header of ``/seed_session``, and keeps serving ``/verify``
while a checkpoint is open.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.server.app import create_server_app
from gym_services.base.config import ServerConfig
from gym_services.base.http import parse_body, read_json_object
from gym_services.control.admission import RoutePolicy
from gym_services.resources.common.sessions import ResourcesParticipant
from gym_services.resources.math_formal_lean import feedback, proof
from gym_services.resources.math_formal_lean.sandbox_client import LeanSandbox


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
    refinement_prompt_template: str = Field(
        default=feedback.DEFAULT_REFINEMENT_TEMPLATE,
        description="str.format template with {problem}, {attempt}, {error_feedback}",
    )

    @field_validator("refinement_prompt_template")
    @classmethod
    def _template_formats(cls, value: str) -> str:
        feedback.check_template(value)
        return value


class VerifyRequest(BaseModel):
    """The task row plus the model's response; unknown fields are echoed back."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    header: str = ""
    formal_statement: str
    informal_prefix: str | None = None
    name: str | None = None
    turn_index: int = Field(default=0, ge=0)


class VerifyResponse(VerifyRequest):
    reward: float
    proof_status: str
    predicted_proof: str
    compiler_output: dict[str, Any] | None
    needs_correction: bool
    error_feedback: str | None
    correction_prompt: str | None


class Verifier:
    """The ``/verify`` logic, independent of HTTP so tests can call it directly."""

    def __init__(self, config: Config, sandbox: LeanSandbox) -> None:
        self.config = config
        self.sandbox = sandbox

    async def verify(self, req: VerifyRequest) -> VerifyResponse:
        cfg = self.config
        text = proof.output_text(req.response)
        compiler_output: dict[str, Any] | None = None
        code = ""
        if not text.strip():
            status = "empty_generation"
        else:
            extracted = proof.extract_code(text, cfg.extract_code_mode)
            code = proof.build_code(
                req.header,
                req.formal_statement,
                extracted,
                restate_formal_statement=cfg.restate_formal_statement,
                strip_theorem_from_proof=cfg.strip_theorem_from_proof,
            )
            compiler_output = await self.sandbox.execute(
                code, timeout_s=cfg.compilation_timeout, max_output_characters=cfg.max_output_characters
            )
            status = feedback.proof_status(compiler_output)
        verdict = feedback.verdict(status)
        errors = feedback.error_feedback(status, compiler_output, code, cfg.compilation_timeout)
        prompt = None
        if verdict.needs_correction and errors is not None:
            prompt = feedback.correction_prompt(
                cfg.refinement_prompt_template,
                problem=feedback.problem_text(req.header, req.informal_prefix, req.formal_statement),
                attempt=code or text.strip() or "(no proof was given)",
                error_feedback=errors,
            )
        # Result fields win over same-named fields a caller echoed into its request.
        return VerifyResponse.model_validate(
            {
                **req.model_dump(),
                "reward": verdict.reward,
                "proof_status": verdict.proof_status,
                "predicted_proof": code,
                "compiler_output": compiler_output,
                "needs_correction": verdict.needs_correction,
                "error_feedback": errors,
                "correction_prompt": prompt,
            }
        )


def create_app(config: Config, *, sandbox_transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """``sandbox_transport`` lets tests and the demo run the sandbox stand-in in process."""
    participant = ResourcesParticipant(None, mode="stateless", verify="replay")
    sandbox = LeanSandbox(
        config.sandbox_host,
        config.sandbox_port,
        timeout_margin_s=config.sandbox_timeout_margin_s,
        max_connections=config.sandbox_max_connections,
        transport=sandbox_transport,
    )
    verifier = Verifier(config, sandbox)

    async def seed(request: Request) -> JSONResponse:
        await read_json_object(request)  # the whole task row is sent; nothing of it is kept
        return JSONResponse({}, headers=participant.seed_headers())

    async def verify(request: Request) -> JSONResponse:
        body = await parse_body(request, VerifyRequest)
        result = await verifier.verify(body)
        request.app.state.lean_verifications.labels(proof_status=result.proof_status).inc()
        return JSONResponse(result.model_dump(mode="json"))

    async def close_sandbox() -> None:
        await sandbox.aclose()

    app = create_server_app(
        config,
        participant,
        [Route("/seed_session", seed, methods=["POST"]), Route("/verify", verify, methods=["POST"])],
        # Nothing here holds state: both routes keep serving while a checkpoint is open.
        policies={"/verify": RoutePolicy.OPEN, "/seed_session": RoutePolicy.OPEN},
        on_shutdown=[close_sandbox],
    )
    app.state.lean_verifications = app.state.metrics.counter(
        "gym_lean_verifications", "Lean verifications by proof status", ("proof_status",)
    )
    app.state.verifier = verifier
    return app
