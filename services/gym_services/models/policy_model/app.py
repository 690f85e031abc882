"""The policy model server: ``POST /v1/responses`` over a streaming chat completions upstream.

Agents call ``/v1/responses`` (the OpenAI Responses API, as NeMo Gym's model servers serve it); the server converts the
request to chat completions, streams the generation from ``upstream.base_url`` (the built-in inference worker locally,
vLLM in production) and converts the text back into Responses output items.

Checkpointing (role ``model``, ``docs/participants.md``; details in :mod:`.generations`):

- prepare closes admission (new calls: ``409 checkpoint_parked``; the route is ``GATED_NOWAIT``) and
  cuts every in-flight generation at its next token boundary; the HTTP calls stay open;
- a response finishing while a checkpoint is open is held and delivered at resume;
- resume/abort: cut calls continue from their prefix's token ids (never re-tokenized text; the engine
  adapter, :mod:`.engines`) and return one response equal to the uninterrupted one, token ids and
  log-probs included;
- capture takes a record per (rollout, request digest) in scope: cut prefixes, and held responses
  whole (so a restored model re-answers them without generating); restore stages them for attempt + 1,
  and the re-issued request continues from its prefix; a prefix is used once;
- identity comes from ``x-ng-rollout-id`` / ``x-ng-attempt`` (stale attempts are fenced with ``409
  stale_attempt`` by the admission middleware, and a newer attempt, a restore or a retire ends the
  older attempt's open calls with the same 409). Calls without identity are cut and held like the
  others but never written to a checkpoint.

The upstream may be a fleet of inference workers (``upstream.base_url`` as a list, a ``{0..N-1}``
range, or a headless Service with ``upstream.resolve``): each stream goes to the healthy worker with
the fewest outstanding tokens, and every worker is health-checked (:mod:`.fleet`).

A failing upstream is a fault the generation rides out (``upstream_retry``, :mod:`.generations`):
what arrived before a worker died stays as the prefix, and the generation continues it at once on
another worker of the fleet, or, with none up, on the restarted worker after a bounded backoff; the
call fails (``503 upstream_unavailable``) only after ``upstream_retry.deadline_s`` without progress.

The token ledger (``/v1/ledger/*``, :mod:`.ledger`) holds each rollout's training tokens, one entry per
call, under NeMo Gym's ``token_id_capture`` contracts; with ``record_tokens`` every call with rollout identity
is recorded into it (an intent before dispatch, the entry before the response goes out,
:mod:`.ledger.recording`). It is part of this participant's checkpoint records.

``stream: true`` is answered with synthetic Responses API SSE events once the generation is finished
(:mod:`.stream_events`), as the reference model server does, so streaming changes no checkpoint rule.

With ``return_token_id_information`` the last output item of a response carries the generation's
:class:`~gym_services.base.tokens.Tokens` as ``prompt_token_ids``, ``generation_token_ids`` and
``generation_log_probs`` (NeMo Gym's ``…__training`` items), as NeMo Gym's ``vllm_model`` does.

Responses are deterministic: ids derive from the request digest, and ``created_at`` is 0 unless
``stable_created_at`` is false, so a checkpointed run can be compared byte for byte with an
uninterrupted one.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gym_services.base import id_json
from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body
from gym_services.base.identity import RolloutIdentity
from gym_services.base.metrics import Metrics
from gym_services.base.tokens import Tokens
from gym_services.control.admission import RoutePolicy
from gym_services.models.policy_model.fleet import FleetMetrics
from gym_services.models.policy_model.generations import GenerationManager, ModelCounters
from gym_services.models.policy_model.ledger.recording import LEDGER_CALL_HEADER, MOVED_FIELDS, record_call
from gym_services.models.policy_model.ledger.rollouts import DEFAULT_MAX_BYTES, TokenLedger
from gym_services.models.policy_model.ledger.routes import ledger_routes
from gym_services.models.policy_model.participant import ModelParticipant
from gym_services.models.policy_model.responses import ResponsesRequest, build_response, chat_body, request_digest
from gym_services.models.policy_model.stream_events import encode_sse, response_events
from gym_services.models.policy_model.upstream import Upstream, UpstreamConfig, UpstreamRetry
from gym_services.server.app import create_server_app, held

SSE_HEADERS = {"cache-control": "no-cache"}
#: the config key ``record_tokens`` was called before; still read, with a warning
OLD_RECORD_TOKENS_KEY = "capture_tokens"


class LedgerConfig(BaseModel):
    """Back-pressure of the token ledger (``docs/decisions.md``, "A slow trainer slows the collection, not the
    checkpoint")."""

    model_config = ConfigDict(extra="forbid")

    max_bytes: int = Field(
        default=DEFAULT_MAX_BYTES,
        ge=1,
        description="the stored bytes of rollouts the ledger holds (live ones and finished ones no trainer dropped "
        "yet) beyond which a call opening a new rollout waits for drops",
    )
    full_wait_s: float = Field(
        default=300.0,
        gt=0,
        description="how long such a call waits before it is answered 503 not_ready (the agent calls again)",
    )


class Config(ServerConfig):
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    upstream_retry: UpstreamRetry = Field(default_factory=UpstreamRetry)
    cut_wait_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="how long a final checkpoint's cut waits for the upstream to end a stream it was told to stop "
        "before closing it anyway (a checkpoint the stack resumes from never stops a stream)",
    )
    stable_created_at: bool = Field(default=True, description="created_at = 0, so responses are reproducible")
    return_token_id_information: bool = Field(
        default=False,
        description="put prompt_token_ids, generation_token_ids and generation_log_probs on the last output item of "
        "every response (NeMo Gym's vllm_model option of the same name; what NeMo RL trains on)",
    )
    record_tokens: bool = Field(
        default=False,
        description="record every call of a rollout into the token ledger (/v1/ledger/*) for a trainer to freeze "
        "and drop; a call without token information from the upstream marks its rollout incomplete "
        "(capture_tokens, its old name, is still read, with a warning)",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_record_tokens_key(cls, data: Any) -> Any:
        """``capture_tokens`` (the old name of ``record_tokens``) is read as ``record_tokens``, with a warning."""
        if not isinstance(data, dict) or OLD_RECORD_TOKENS_KEY not in data:
            return data
        data = dict(data)
        value = data.pop(OLD_RECORD_TOKENS_KEY)
        if "record_tokens" in data:
            raise ValueError(f"{OLD_RECORD_TOKENS_KEY} is the old name of record_tokens: set only record_tokens")
        # FutureWarning: Python's category for a deprecation its end users see (a DeprecationWarning is hidden)
        warnings.warn(
            f"the policy model's config key {OLD_RECORD_TOKENS_KEY!r} is deprecated: call it 'record_tokens'",
            FutureWarning,
            stacklevel=1,
        )
        return {**data, "record_tokens": value}


@dataclass(frozen=True)
class PolicyModel:
    """The server's state, held on ``app.state.held`` for its endpoints."""

    config: Config
    upstream: Upstream
    manager: GenerationManager
    ledger: TokenLedger

    async def shutdown(self) -> None:
        self.manager.shutdown()
        await self.upstream.close()


async def responses(request: Request) -> Response:
    server = held(request, PolicyModel)
    config = server.config
    body = await parse_body(request, ResponsesRequest)
    model = config.upstream.model or body.model
    if not model:
        raise ApiError(ErrorCode.BAD_REQUEST, "no model: set upstream.model in the config or model in the request")
    created_at = 0.0 if config.stable_created_at else time.time()
    identity = RolloutIdentity.from_headers(request.headers)
    digest = request_digest(body)
    drop_input_tokens(body)
    recorded = identity if config.record_tokens else None
    if recorded is not None:  # the intent before dispatch: a call lost from here on masks the rollout
        await server.ledger.room_for(recorded.rollout_id, config.ledger.full_wait_s)
        server.ledger.begin_call(recorded.rollout_id, digest, recorded.attempt)
    generation = await server.manager.generate(identity, digest, chat_body(body, model), body.max_output_tokens)
    assert generation.finish_reason is not None
    tokens = generation.tokens()
    response = build_response(
        body,
        digest,
        body.model or model,
        generation.text,
        generation.finish_reason,
        generation.prompt_tokens or 0,
        generation.completion_tokens,
        created_at,
        tokens=_reported(tokens) if config.return_token_id_information else None,
    )
    headers = {}
    if recorded is not None:
        items = body.input if isinstance(body.input, list) else None
        if record_call(server.ledger, recorded, digest, body.model or model, items, response, tokens) and (
            config.return_token_id_information
        ):
            headers[LEDGER_CALL_HEADER] = digest  # the answer's tokens are this ledger call's
    if body.stream:  # generated in full first, so checkpoint rules apply before any byte is sent
        headers.update(SSE_HEADERS)
        return Response(encode_sse(response_events(response)), media_type="text/event-stream", headers=headers)
    # JSONResponse's bytes, the ids written faster (thousands of long prompts a minute: base/id_json.py)
    return Response(id_json.dumps(response, "output", allow_nan=False), media_type="application/json", headers=headers)


def drop_input_tokens(body: ResponsesRequest) -> None:
    """The request's items without the token fields earlier answers carried back (the digest counted them): the
    chat sent upstream, the lineage stamps and the response never read them, and a request is held while its
    generation runs (thousands at once, each carrying every earlier call's prompt ids)."""
    if isinstance(body.input, list):
        for item in body.input:
            if isinstance(item, dict):
                for name in MOVED_FIELDS:
                    item.pop(name, None)


def _reported(tokens: Tokens | None) -> Tokens:
    if tokens is None:
        raise ApiError(ErrorCode.UPSTREAM_ERROR, "the upstream reported no prompt token ids for this generation")
    return tokens


def create_app(config: Config) -> Starlette:
    metrics = Metrics(config.name)
    upstream = Upstream(config.upstream, FleetMetrics.declare(metrics))
    manager = GenerationManager(
        upstream,
        config.cut_wait_s,
        ModelCounters.declare(metrics),
        config.upstream_retry,
        token_information=config.return_token_id_information,
    )
    ledger = TokenLedger(max_bytes=config.ledger.max_bytes)
    server = PolicyModel(config, upstream, manager, ledger)
    app = create_server_app(
        config,
        ModelParticipant(manager, ledger),
        [Route("/v1/responses", responses, methods=["POST"]), *ledger_routes(ledger)],
        metrics=metrics,
        policies={"/v1/responses": RoutePolicy.GATED_NOWAIT},
        on_startup=[upstream.start],
        on_shutdown=[server.shutdown],
    )
    app.state.held = server
    app.state.generations = manager
    app.state.ledger = ledger
    return app
