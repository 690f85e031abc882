"""The built-in inference worker: an OpenAI-compatible chat completions server with deterministic policies.

It stands where vLLM stands in production (``docs/participants.md``, "The policy model"), so the policy model talks to
it exactly as it would to vLLM: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (SSE with
``stream: true``), ``POST /tokenize``, ``POST /detokenize``, ``GET /v1/models``.

Tokens and log-probs, as vLLM answers them
    Text is tokenized byte-level with sub-word tokens (:mod:`.tokenizer`: a token can end inside a word
    or inside a multi-byte character) and chats are rendered with a ChatML-style template into prompt
    token ids. ``logprobs``/``top_logprobs`` (chat) and ``logprobs: k`` (completions) report each
    token's log-prob; ``return_tokens_as_token_ids`` names tokens ``token_id:<id>``; ``return_token_ids``
    adds ``prompt_token_ids`` and each choice's ``token_ids``. A natural stop generates the EOS token
    (``<|im_end|>``: an id and a log-prob, no text), as vLLM reports it. The log-probs are a
    deterministic function of the context's token ids, the token, ``seed`` and ``temperature``
    (:func:`.generation.score`): the same ids and seed always give the same log-probs.

Generation text and tool calls
    A completion is one string written by the policy chosen by ``model`` (see ``policies/``). Tool
    calls are part of that string as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (:mod:`gym_services.models.tool_markup`), the way Hermes/Qwen-style models write them when vLLM
    runs without a tool parser. The worker streams the raw text, markup included, as ``delta.content``
    token by token, and *also* parses the complete calls into OpenAI ``tool_calls``: in
    ``message.tool_calls`` (non-streaming) and in the ``delta.tool_calls`` of the last chunk, whose
    ``finish_reason`` is then ``tool_calls``. Streaming and non-streaming give the same content and calls.

Continuation from token ids
    ``/v1/completions`` takes a token-id ``prompt``: a rendered chat followed by the answer's token ids
    so far (a cut generation's prefix). The policy runs on the chat and the worker emits the tokens
    that follow those ids, with the log-probs the uninterrupted generation had, so prefix +
    continuation is exactly the uninterrupted generation, id for id, wherever it was cut (inside a
    word, a multi-byte character, tool-call markup). Ids that spell the right text but are tokenized
    differently are continued from their bytes, with other ids and log-probs, as a real model would be
    conditioned on them; an answer the policy would not have written is refused with ``400
    prefix_mismatch``. The chat route serves no text continuation (``continue_final_message``): a
    continuation from re-tokenized text is what this design rules out.

Pace and accounting
    The first token comes after ``time_to_first_token_s``, then one every ``1/tokens_per_second``
    (0 = as fast as possible); a natural stop takes one more step (the end-of-sequence token: generated
    and counted, but with no text, like a token ending inside a multi-byte character, so a client counts
    tokens by their ids, never by chunks with text) before the chunk carrying ``finish_reason``. A token is counted
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

from dataclasses import dataclass

from pydantic import Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.base.config import CheckpointConfig, ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body
from gym_services.base.metrics import Metrics
from gym_services.control.participant import NothingToRestore
from gym_services.control.protocol import CheckpointMode, Role, VerifyMode
from gym_services.models.inference_worker import tokenizer
from gym_services.models.inference_worker.chat import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from gym_services.models.inference_worker.generation import (
    CompletionResponse,
    Pace,
    TokenMirror,
    WorkerStats,
    plan_chat,
    plan_text_completion,
    token_mirror_path,
)
from gym_services.models.inference_worker.policies import POLICIES, Policy
from gym_services.server.app import create_server_app, held

#: the context length /tokenize reports (the worker itself sets no limit)
MAX_MODEL_LEN = 131072


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


class BackendParticipant(NothingToRestore):
    """The worker keeps no rollout state; if checkpointing is switched on it takes part as stateless."""

    role = Role.MODEL
    checkpoint_mode = CheckpointMode.STATELESS
    checkpoint_verify = VerifyMode.REPLAY


@dataclass(frozen=True)
class Worker:
    """The worker's state, held on ``app.state.held`` for its endpoints: its policies, pace and counters."""

    served: dict[str, Policy]
    pace: Pace
    stats: WorkerStats

    def policy_of(self, model: str | None) -> Policy:
        policy = self.served.get(model or "")
        if policy is None:
            raise ApiError(
                ErrorCode.MODEL_NOT_FOUND, f"model {model!r} is not served; try one of {sorted(self.served)}"
            )
        return policy


async def chat_completions(request: Request) -> CompletionResponse:
    worker = held(request, Worker)
    body = await parse_body(request, ChatCompletionRequest)
    return CompletionResponse(plan_chat(body, worker.policy_of(body.model)), body, worker.pace, worker.stats)


async def completions(request: Request) -> CompletionResponse:
    worker = held(request, Worker)
    body = await parse_body(request, CompletionRequest)
    return CompletionResponse(plan_text_completion(body, worker.policy_of(body.model)), body, worker.pace, worker.stats)


async def tokenize(request: Request) -> JSONResponse:
    body = await parse_body(request, TokenizeRequest)
    if body.messages is not None:
        turns = [(m.role, m.raw_text()) for m in body.messages]
        tokens = tokenizer.render_chat(turns, body.tools, body.add_generation_prompt)
    else:
        tokens = tokenizer.encode(body.prompt or "")
    return JSONResponse({"count": len(tokens), "max_model_len": MAX_MODEL_LEN, "tokens": tokens, "token_strs": None})


async def detokenize(request: Request) -> JSONResponse:
    body = await parse_body(request, DetokenizeRequest)
    try:
        return JSONResponse({"prompt": tokenizer.decode(body.tokens)})
    except ValueError as exc:
        raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None


async def models(request: Request) -> JSONResponse:
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "gym-checkpoint", "description": p.description}
        for name, p in held(request, Worker).served.items()
    ]
    return JSONResponse({"object": "list", "data": data})


async def stats_route(request: Request) -> JSONResponse:
    return JSONResponse(held(request, Worker).stats.counts())


def create_app(config: Config) -> Starlette:
    unknown = sorted(set(config.models or []) - set(POLICIES))
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {sorted(POLICIES)}")
    served = {name: POLICIES[name] for name in (config.models or POLICIES)}
    pace = Pace(config.time_to_first_token_s, config.tokens_per_second)
    metrics = Metrics(config.name)
    mirror = TokenMirror(token_mirror_path(config.stats_dir, config.participant_id)) if config.stats_dir else None
    stats = WorkerStats.declare(metrics, mirror)
    app = create_server_app(
        config,
        BackendParticipant(),
        [
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/stats", stats_route, methods=["GET"]),
        ],
        metrics=metrics,
    )
    app.state.held = Worker(served, pace, stats)
    app.state.stats = stats
    return app
