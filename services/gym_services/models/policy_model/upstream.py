"""Streaming chat completions from an OpenAI-compatible upstream: the built-in worker or vLLM, one or a
fleet of them (:mod:`.fleet`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from gym_services.base.affinity import Endpoints, expand_endpoints
from gym_services.base.connection_pools import PooledTransport
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.models.policy_model.engines import (
    ENGINES,
    Connection,
    Delta,
    Engine,
    EngineError,
    EngineRequest,
    EngineUnavailable,
    Halt,
)
from gym_services.models.policy_model.fleet import Fleet, FleetMetrics, Resolver, Worker

log = get_logger("policy_model.upstream")


class UpstreamConfig(BaseModel):
    """Where generations come from: the built-in worker locally, vLLM in production."""

    model_config = ConfigDict(extra="forbid")

    base_url: Endpoints = Field(
        default="http://127.0.0.1:8001/v1",
        description="OpenAI base URL, ending in /v1; several inference workers as a list (or one URL with a {0..N-1} "
        "range), or with resolve: a headless Service name whose every address is a worker",
    )
    resolve: bool = Field(
        default=False,
        description="resolve each base_url's host to all its addresses (a headless Service: one per pod), "
        "one worker each, again every resolve_interval_s; http only",
    )
    resolve_interval_s: float = Field(
        default=10.0, gt=0, le=3600, description="how often resolve looks the workers up again"
    )
    health_interval_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="how often every worker's GET /models is probed (a failed worker is back when it answers)",
    )
    health_timeout_s: float = Field(
        default=5.0, gt=0, le=600, description="a probe not answered this fast marks the worker down"
    )
    expected_tokens: int = Field(
        default=512,
        ge=1,
        le=1_000_000,
        description="the first guess of a generation's length, for spreading load by outstanding tokens "
        "(then a running mean)",
    )
    engine: str = Field(
        default="vllm",
        description="the engine's wire format (an adapter of models/policy_model/engines): "
        "vllm (vLLM, the built-in worker), llama.cpp (llama-server, the tests' real engine)",
    )
    api_key: SecretStr | None = None
    model: str | None = Field(default=None, description="model name sent upstream; the request's when unset")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=600.0, gt=0, description="longest silence between two chunks")
    max_connections: int = Field(
        default=4096,
        ge=1,
        description="streams open to the workers at once (a generation holds one for its life); more wait for one",
    )
    continuous_usage: bool = Field(
        default=True, description="ask for usage on every chunk (vLLM stream_options.continuous_usage_stats)"
    )
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every upstream request")

    @model_validator(mode="after")
    def _resolvable(self) -> UpstreamConfig:
        if self.engine not in ENGINES:
            raise ValueError(f"engine {self.engine!r} is unknown; known: {sorted(ENGINES)}")
        if self.resolve and any(not url.startswith("http://") for url in expand_endpoints(self.base_url)):
            raise ValueError("resolve needs http:// base URLs (an address in place of the name would fail TLS checks)")
        return self


class UpstreamRetry(BaseModel):
    """How a generation rides out a failing upstream (a worker killed, restarting, overloaded)."""

    model_config = ConfigDict(extra="forbid")

    deadline_s: float = Field(
        default=120.0,
        gt=0,
        le=86400,
        description="a generation whose upstream cannot be reached or fails mid-stream keeps what it streamed and "
        "retries this long without progress; then the call fails with 503 upstream_unavailable",
    )
    backoff_s: float = Field(default=0.2, gt=0, le=60, description="first wait before a retry; doubles each time")
    backoff_max_s: float = Field(default=5.0, gt=0, le=300, description="longest wait between two retries")


class UpstreamUnavailable(ApiError):
    """The upstream could not be reached, refused for now, or broke off a stream: a fault of the worker,
    not of the request, so the generation keeps its prefix and continues elsewhere or later.
    ``worker`` is the base URL of the worker that failed, when one did."""

    def __init__(self, message: str, *, details: Any = None, worker: str | None = None) -> None:
        super().__init__(ErrorCode.UPSTREAM_UNAVAILABLE, message, details=details)
        self.worker = worker


class Upstream:
    """The HTTP clients of every generation of this model server, over its fleet of workers (:mod:`.fleet`): each
    stream goes to the least loaded healthy worker, and a worker a stream fails on is taken out of rotation until
    its health probe answers again. Streams go through an aiohttp session (``docs/decisions.md``, "The policy model
    reads its streams with aiohttp"), requests with one answer (tokenize, health probes, llama.cpp's steps) through
    an httpx client in small connection pools (:mod:`gym_services.base.connection_pools`)."""

    def __init__(
        self, config: UpstreamConfig, metrics: FleetMetrics | None = None, resolver: Resolver | None = None
    ) -> None:
        self.config = config
        self.fleet = Fleet(
            config.base_url,
            expected_tokens=config.expected_tokens,
            resolve=config.resolve,
            metrics=metrics,
            **({"resolver": resolver} if resolver is not None else {}),
        )
        self.engine: Engine = ENGINES[config.engine]()
        self._client: httpx.AsyncClient | None = None
        self._streams: aiohttp.ClientSession | None = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        c = self.config
        headers = {"authorization": f"Bearer {c.api_key.get_secret_value()}"} if c.api_key else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(c.read_timeout_s, connect=c.connect_timeout_s),
            transport=PooledTransport(c.max_connections),
            trust_env=False,
        )
        self._streams = aiohttp.ClientSession(
            headers=headers,
            connector=aiohttp.TCPConnector(limit=c.max_connections, limit_per_host=0),
            # connect: a free connection of the bound and the connection made, as httpx's pool timeout was
            timeout=aiohttp.ClientTimeout(
                total=None, connect=c.read_timeout_s, sock_connect=c.connect_timeout_s, sock_read=c.read_timeout_s
            ),
            trust_env=False,
        )
        await self.fleet.refresh()
        self._watch = asyncio.create_task(self._watch_workers(), name="upstream-health")

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        client, self._client = self._client, None
        streams, self._streams = self._streams, None
        if client is not None:
            await client.aclose()
        if streams is not None:
            await streams.close()

    async def _watch_workers(self) -> None:
        """Probe every worker every ``health_interval_s``; re-resolve every ``resolve_interval_s``."""
        c = self.config
        resolved_at = time.monotonic()
        while True:
            await asyncio.sleep(c.health_interval_s)
            try:
                if c.resolve and time.monotonic() - resolved_at >= c.resolve_interval_s:
                    resolved_at = time.monotonic()
                    await self.fleet.refresh()
                if self._client is not None:
                    await self.fleet.probe(self._client, c.health_timeout_s)
            except Exception as exc:
                log.warning("worker health round failed", extra={"error": f"{type(exc).__name__}: {exc}"})

    def _connection(self) -> tuple[Worker, Connection]:
        """The least loaded healthy worker, and the engine's way to it."""
        if self._client is None or self._streams is None:
            raise ApiError(ErrorCode.NOT_READY, "the upstream client is not started")
        worker = self.fleet.pick()
        if worker is None:
            raise UpstreamUnavailable(f"no inference worker: {self.config.base_url} resolves to no address")
        c = self.config
        return worker, Connection(self._client, self._streams, worker.base_url, c.extra_body, c.continuous_usage)

    def _failure(self, worker: Worker, exc: Exception) -> ApiError:
        """What a failure of ``worker`` means to the generation: a worker fault (:class:`UpstreamUnavailable`;
        the worker is out of rotation until its probe answers) or an answer it cannot use (``502
        upstream_error``)."""
        status = exc.status if isinstance(exc, (EngineError, EngineUnavailable)) else None
        details = {"upstream_status": status} if status is not None else None
        what = str(exc) if isinstance(exc, (EngineError, EngineUnavailable)) else f"{type(exc).__name__}: {exc}"
        message = f"upstream {worker.base_url}: {what}"
        if isinstance(exc, (EngineUnavailable, httpx.TransportError)):  # refused, reset, broken off, timed out
            self.fleet.failed(worker, message)
            return UpstreamUnavailable(message, details=details, worker=worker.base_url)
        return ApiError(ErrorCode.UPSTREAM_ERROR, message, details=details)

    async def prompt_token_ids(self, chat: dict[str, Any]) -> list[int]:
        """The prompt's token ids for ``chat``, asked of a healthy worker (when a stream did not report them)."""
        worker, connection = self._connection()
        try:
            return await self.engine.prompt_token_ids(connection, chat)
        except (EngineError, EngineUnavailable, httpx.HTTPError) as exc:
            raise self._failure(worker, exc) from None

    async def deltas(
        self, request: EngineRequest, halt: Halt | None = None, prefix_tokens: int = 0
    ) -> AsyncGenerator[Delta]:
        """Run one generation (the engine's ``request``) on the least loaded worker (:meth:`Engine.deltas`);
        closing this generator early ends the engine's exchange. ``prefix_tokens`` is what the generation
        already has (for the load estimate).

        Once ``halt`` is requested the engine delivers what the worker already generated and ends at a token
        boundary. Any other failure of the worker (refused, reset, broken off, a transient status, an end
        without ``finish_reason``) marks it down and raises :class:`UpstreamUnavailable` naming it.
        """
        worker, connection = self._connection()
        halt = halt or Halt()
        stream = self.fleet.open(worker, self.fleet.expected(request.body.get("max_tokens"), prefix_tokens))
        finished = False
        try:
            async with contextlib.aclosing(self.engine.deltas(connection, request, halt)) as deltas:
                async for delta in deltas:
                    if delta.generation_token_ids:
                        self.fleet.received(stream, len(delta.generation_token_ids))
                    finished = finished or delta.finish_reason is not None
                    yield delta
                    del delta  # not held while the next one is awaited (a first delta holds the prompt's ids)
            if not finished and not halt.requested:
                raise EngineUnavailable("it ended the generation without a finish_reason")
        except (EngineError, EngineUnavailable, httpx.HTTPError) as exc:
            raise self._failure(worker, exc) from None
        finally:
            self.fleet.close(stream, prefix_tokens + stream.received if finished else None)
