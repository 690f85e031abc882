"""The built-in inference worker: an OpenAI-compatible chat completions server with deterministic policies.

It stands where vLLM stands in production (``docs/participants.md``, "The policy model"), so the policy model talks to it exactly as
it would to vLLM: ``POST /v1/chat/completions`` (SSE with ``stream: true``), ``GET /v1/models``.

Generation text and tool calls
    A completion is one string written by the policy chosen by ``model`` (see ``policies/``). Tool
    calls are part of that string as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (:mod:`gym_services.models.tool_markup`), the way Hermes/Qwen-style models write them when vLLM
    runs without a tool parser. The worker streams the raw text, markup included, as ``delta.content``
    token by token, and *also* parses the complete calls into OpenAI ``tool_calls``: in
    ``message.tool_calls`` (non-streaming) and in the ``delta.tool_calls`` of the last chunk, whose
    ``finish_reason`` is then ``tool_calls``. Streaming and non-streaming give the same content and calls.

Assistant-prefix continuation
    With ``continue_final_message: true`` the last (assistant) message is a prefix of the answer: the
    policy runs on the messages before it and the worker emits only what follows the prefix, so
    prefix + continuation is exactly the uninterrupted text, wherever the prefix was cut (inside a
    word, inside tool-call markup). Like vLLM, ``content`` then holds only the new text; ``tool_calls``
    are parsed from the whole message (prefix + continuation). A prefix the policy would not have
    written is refused with ``400 prefix_mismatch``. ``usage.prompt_tokens`` of a continuation is the
    original prompt's plus the prefix's tokens.

Pace and accounting
    The first token comes after ``time_to_first_token_s``, then one every ``1/tokens_per_second``
    (0 = as fast as possible); a natural stop takes one more step (the end-of-sequence token, neither
    shown nor counted) before the chunk carrying ``finish_reason``. A token is counted
    (``gym_worker_tokens_generated``, ``GET /stats``) only if it goes out on a connection the client
    has not closed, not even its sending half (:mod:`.generation`): a counted streamed token always
    reaches a client that keeps reading, and closing either half of the stream stops generation.
    ``GET /stats`` also shows the requests still in progress (``active``); ``stats_dir`` mirrors the
    count into a file that outlives a SIGKILL (:class:`~.generation.TokenMirror`).
    ``stream_options.include_usage`` adds the final usage chunk; ``continuous_usage_stats`` (a vLLM
    option) puts running usage on every chunk.

The worker is a backend, not a checkpoint participant: ``checkpoint.enabled`` is false by default, so
no control routes or admission are mounted; health, metrics and JSON errors come from the app factory.
"""

from __future__ import annotations

from pydantic import Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.server.app import create_server_app
from gym_services.base.config import CheckpointConfig, ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body
from gym_services.base.metrics import Metrics
from gym_services.control.participant import Participant
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode
from gym_services.models.inference_worker.chat import ChatCompletionRequest
from gym_services.models.inference_worker.generation import (
    CompletionResponse,
    Pace,
    TokenMirror,
    WorkerStats,
    plan_completion,
    token_mirror_path,
)
from gym_services.models.inference_worker.policies import POLICIES


class Config(ServerConfig):
    checkpoint: CheckpointConfig = Field(default_factory=lambda: CheckpointConfig(enabled=False))
    tokens_per_second: float = Field(default=0.0, ge=0, description="0 = as fast as possible")
    time_to_first_token_s: float = Field(default=0.0, ge=0, le=600)
    models: list[str] | None = Field(default=None, description="policies served; all when unset")
    stats_dir: str | None = Field(
        default=None,
        description="mirror the token count into <stats_dir>/<participant id>.tokens (memory-mapped, 8 bytes "
        "little-endian), readable after a SIGKILL: how the demo and the benchmarks count what a live worker generated "
        "(a killed one's mirror can miss the token a kill caught between the socket and the count; they count it by "
        "what the policy models received from it)",
    )


class BackendParticipant(Participant):
    """The worker keeps no rollout state; if checkpointing is switched on it takes part as stateless."""

    role = Role.MODEL
    checkpoint_mode = CheckpointMode.STATELESS
    checkpoint_verify = VerifyMode.REPLAY


def create_app(config: Config) -> Starlette:
    unknown = sorted(set(config.models or []) - set(POLICIES))
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {sorted(POLICIES)}")
    served = {name: POLICIES[name] for name in (config.models or POLICIES)}
    pace = Pace(config.time_to_first_token_s, config.tokens_per_second)
    metrics = Metrics(config.name)
    mirror = TokenMirror(token_mirror_path(config.stats_dir, config.participant_id)) if config.stats_dir else None
    stats = WorkerStats.declare(metrics, mirror)

    async def completions(request: Request) -> CompletionResponse:
        body = await parse_body(request, ChatCompletionRequest)
        policy = served.get(body.model)
        if policy is None:
            raise ApiError(ErrorCode.MODEL_NOT_FOUND, f"model {body.model!r} is not served; try one of {sorted(served)}")
        return CompletionResponse(plan_completion(body, policy), body, pace, stats)

    async def models(request: Request) -> JSONResponse:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "gym-checkpoint", "description": p.description}
            for name, p in served.items()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def stats_route(request: Request) -> JSONResponse:
        return JSONResponse(stats.snapshot())

    app = create_server_app(
        config,
        BackendParticipant(),
        [
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/stats", stats_route, methods=["GET"]),
        ],
        metrics=metrics,
    )
    app.state.stats = stats
    return app
