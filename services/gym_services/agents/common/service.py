"""The Starlette service every agent runs: ``POST /run``, the ``/v1/responses`` self-proxy, control plane.

- ``/run`` is ``OPEN`` for admission: the agent parks its episodes itself, at boundaries.
  With checkpointing on it needs a rollout identity (``400 rollout_id_required``); a
  stale attempt gets ``409 stale_attempt`` and changes nothing.
- ``/v1/responses`` forwards to the policy model with the caller's identity and the
  model's cookies. Its answer passes through unchanged, so the model's ``409
  checkpoint_parked`` reaches ``/run`` as a 409 (never a 500); a model that cannot be
  reached, whose connection broke mid-call (it died: a generation is a replay step), or whose
  worker stayed down (``503 upstream_unavailable``), is a ``503 upstream_unavailable`` here, so
  the episode retries the step later. It is ``GATED_NOWAIT``:
  refused while the agent is closed, while a generation already in flight does not
  block prepare (it is a replay step).
- ``GET /health/downstream`` (``OPEN``) names the servers and routes episodes are retrying now
  (:class:`~gym_services.base.downstream.DownstreamReport`; the collection reads it).
- The episode loop calls the proxy in process (an ASGI transport to this very app), so
  its generations pass the agent's own admission and fencing like any other call.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie

import httpx
from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_services.agents.common.config import AgentConfig
from gym_services.agents.common.context import MODEL, StepContext, own_cookie_name
from gym_services.agents.common.downstream import (
    UNAVAILABLE_CODES,
    Downstream,
    DownstreamUnavailable,
    cookieless_client,
    error_of,
    json_bytes,
)
from gym_services.agents.common.episode import Episode
from gym_services.agents.common.loop import AgentLoop
from gym_services.agents.common.participant import AgentMetrics, AgentParticipant
from gym_services.agents.common.tokens import LEDGER_CALL_HEADER
from gym_services.base import nemo_http
from gym_services.base.connection_pools import PooledTransport
from gym_services.base.downstream import DOWNSTREAM_PATH
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import body_bytes, parse_json
from gym_services.base.identity import RolloutIdentity
from gym_services.base.metrics import Metrics
from gym_services.base.nemo_responses import CreateParams
from gym_services.control.admission import Admission, RoutePolicy
from gym_services.server.app import create_server_app, held


class RunRequest(BaseModel):
    """What NeMo Gym's agents validate of a ``/run`` row: its create params (the SDK's types, unknown keys
    refused) and a textual rollout id; every other field is the task's and passed on."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    responses_create_params: CreateParams
    rollout_id: str | None = Field(default=None, alias="_ng_rollout_id")


SELF_URL = "http://agent-self"
PASS_HEADERS = ("retry-after", "content-type", LEDGER_CALL_HEADER)


def _request_cookies(request: Request, skip: str) -> dict[str, str]:
    cookies: dict[str, str] = {}
    for raw in request.headers.getlist("cookie"):
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw)
        except CookieError:
            continue
        cookies.update({name: morsel.value for name, morsel in jar.items() if name != skip})
    return cookies


class AgentServer:
    """An agent app's state, held on ``app.state.held`` for its endpoints: its downstream servers (their clients
    are made at startup and closed at shutdown), its admission and its participant."""

    def __init__(
        self,
        config: AgentConfig,
        servers: Mapping[str, str | list[str]],
        transport: httpx.AsyncBaseTransport | None,
        admission: Admission,
    ) -> None:
        self.config = config
        self.servers = servers
        self.transport = transport
        self.admission = admission
        self.own_cookie = own_cookie_name(config.name)
        self.clients: dict[str, httpx.AsyncClient] = {}
        self.downstream: dict[str, Downstream] = {}
        self.app: Starlette | None = None  # this agent's own app: the model proxy is called through it
        self.participant: AgentParticipant | None = None

    async def startup(self) -> None:
        config = self.config
        assert self.app is not None
        for name in (MODEL, *self.servers):
            # a client per server, each episode at most one call in it, with no bound (episodes are bounded by the
            # collection's concurrency): a generation (seconds to minutes) never holds the connection a tool call
            # waits for (a waited step: a checkpoint's prepare waits for it); in small pools, each keeping its
            # connections open between calls (a thousand episodes' calls in one pool cost it most of its loop)
            self.clients[name] = cookieless_client(
                transport=self.transport or PooledTransport(), timeout_s=config.request_timeout_s
            )
        self.clients["self"] = cookieless_client(
            # an unexpected error in the proxy is its 500 reply here too, as it would be over the network
            transport=httpx.ASGITransport(app=self.app, raise_app_exceptions=False),
            timeout_s=config.request_timeout_s,
            base_url=SELF_URL,
        )
        self.downstream[MODEL] = Downstream(MODEL, config.model_url, self.clients[MODEL])
        self.downstream["self"] = Downstream(MODEL, SELF_URL, self.clients["self"])
        for name, url in self.servers.items():
            self.downstream[name] = Downstream(name, url, self.clients[name])

    async def shutdown(self) -> None:
        for client in self.clients.values():
            await client.aclose()
        self.clients.clear()

    def context(self, ep: Episode) -> StepContext:
        others = {name: d for name, d in self.downstream.items() if name in self.servers}
        return StepContext(
            ep.identity,
            self.downstream["self"],
            others,
            self.own_cookie,
            ep.in_flight,
            ep.tokens,
            self.downstream[MODEL],
        )


async def run(request: Request) -> Response:
    agent = held(request, AgentServer)
    assert agent.participant is not None
    body = await nemo_http.read_body(request)
    nemo_http.validate_body(RunRequest, body)  # NeMo Gym's 422 for a row its agents refuse
    assert isinstance(body, dict)
    identity: RolloutIdentity | None
    if agent.config.checkpoint.enabled:
        identity = RolloutIdentity.require_from_run_body(body)
    else:
        identity = RolloutIdentity.from_run_body(body)
    anonymous = identity is None
    if identity is None:
        identity = RolloutIdentity(rollout_id=f"anon-{uuid.uuid4().hex}")
    else:
        agent.admission.fence.observe(identity)  # 409 stale_attempt for an older attempt
    episode = agent.participant.run(identity, body, anonymous=anonymous)
    del body  # the episode holds its row: no second copy here for as long as the episode runs
    return Response(json_bytes(await episode), media_type="application/json")


def forwarded_body(raw: bytes) -> bytes:
    """What the proxy sends the model for a request body: its bytes as they are, or, for a string ``input``, the body
    with it as one user message. The body is parsed to be checked, not kept: a request carries every earlier output
    item's token ids, and parsed they take several times their bytes, for as long as the generation runs (thousands at
    once)."""
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise ApiError(ErrorCode.BAD_REQUEST, "/v1/responses body must be a JSON object")
    if isinstance(body.get("input"), str):
        return json_bytes({**body, "input": [{"role": "user", "content": body["input"]}]})
    return raw if body else b"{}"


async def responses(request: Request) -> Response:
    agent = held(request, AgentServer)
    content = forwarded_body(await body_bytes(request))
    identity = RolloutIdentity.from_headers(request.headers)
    assert agent.participant is not None
    metrics = agent.participant.metrics
    metrics.model_calls.inc()
    metrics.model_call_bytes.inc(len(content))
    try:
        upstream = await agent.downstream[MODEL].send(
            "/v1/responses", content, identity=identity, cookies=_request_cookies(request, agent.own_cookie)
        )
    except DownstreamUnavailable as exc:
        raise ApiError(ErrorCode.UPSTREAM_UNAVAILABLE, str(exc)) from None
    finally:
        metrics.model_calls.dec()
        metrics.model_call_bytes.dec(len(content))
    if upstream.status_code >= 500:
        code, message = error_of(upstream)
        if upstream.status_code == 503 and code in UNAVAILABLE_CODES:
            raise ApiError(ErrorCode.UPSTREAM_UNAVAILABLE, f"model: {code}: {message}")
        raise ApiError(
            ErrorCode.UPSTREAM_ERROR,
            f"model answered {upstream.status_code}: {code or ''} {message}".strip(),
        )
    # 2xx and 4xx (409 checkpoint_parked, 409 stale_attempt, 400 ...) pass through unchanged
    headers = {k: upstream.headers[k] for k in PASS_HEADERS if k in upstream.headers}
    response = Response(upstream.content, status_code=upstream.status_code, headers=headers)
    for raw in upstream.headers.get_list("set-cookie"):
        response.raw_headers.append((b"set-cookie", raw.encode("latin-1")))
    return response


async def downstream_report(request: Request) -> JSONResponse:
    """``GET /health/downstream``: the downstream servers and routes this agent's episodes retry, and since when."""
    participant = held(request, AgentServer).participant
    assert participant is not None
    return JSONResponse(participant.downstream().model_dump(mode="json"))


def create_agent_app(
    config: AgentConfig,
    loop: AgentLoop,
    servers: Mapping[str, str | list[str]],
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Starlette:
    """An agent app running ``loop``; ``servers`` maps downstream names (``resources``, ``env``) to base URLs
    (a replicated server's in ordinal order: each rollout's calls go to the replica holding it).

    ``transport`` replaces the network for downstream calls (tests route them to in-process apps).
    """
    metrics = Metrics(config.name)
    admission = Admission(config.participant_id)
    agent = AgentServer(config, servers, transport, admission)
    participant = agent.participant = AgentParticipant(
        loop, config, admission=admission, metrics=AgentMetrics.declare(metrics), context=agent.context
    )
    app = create_server_app(
        config,
        participant,
        [
            Route("/run", run, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route(DOWNSTREAM_PATH, downstream_report, methods=["GET"]),
        ],
        metrics=metrics,
        admission=admission,
        policies={
            "/run": RoutePolicy.OPEN,
            "/v1/responses": RoutePolicy.GATED_NOWAIT,
            DOWNSTREAM_PATH: RoutePolicy.OPEN,
        },
        on_startup=[agent.startup],
        on_shutdown=[agent.shutdown],
    )
    agent.app = app
    app.state.held = agent
    app.state.agent = participant
    return app
