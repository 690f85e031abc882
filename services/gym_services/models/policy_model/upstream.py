"""Streaming chat completions from an OpenAI-compatible upstream: the built-in worker or vLLM, one or a
fleet of them (:mod:`.fleet`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncGenerator
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from gym_services.base.affinity import Endpoints, expand_endpoints
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.models.policy_model.engines import (
    ENGINES,
    Delta,
    Engine,
    EngineProtocolError,
    EngineRequest,
    EngineUnavailable,
)
from gym_services.models.policy_model.fleet import Fleet, FleetMetrics, Resolver

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
    max_connections: int = Field(default=512, ge=1)
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


#: upstream answers that say "not now" rather than "not this request"
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


class UpstreamUnavailable(ApiError):
    """The upstream could not be reached, refused for now, or broke off a stream: a fault of the worker,
    not of the request, so the generation keeps its prefix and continues elsewhere or later.
    ``worker`` is the base URL of the worker that failed, when one did."""

    def __init__(self, message: str, *, details: Any = None, worker: str | None = None) -> None:
        super().__init__(ErrorCode.UPSTREAM_UNAVAILABLE, message, details=details)
        self.worker = worker


class Halt:
    """Asks one upstream stream to stop generating while what it already sent keeps arriving.

    :meth:`request` closes the sending half of the stream's connection (a TCP half-close). A server
    behind uvicorn (vLLM, the built-in worker) takes the end of the request stream as the client
    leaving and stops generating; every token it wrote before noticing still arrives, because this
    side keeps reading until the upstream ends the stream. A cut therefore keeps every token the
    upstream generated, however far the reader had fallen behind. Without a socket to half-close
    (another transport), the stream ends at the next token instead, as a plain close would.
    """

    def __init__(self) -> None:
        self.requested = False
        self.draining = False
        self._socket: Any = None

    def attach(self, sock: Any) -> None:
        """The connection's socket (``socket.socket`` or asyncio's ``TransportSocket``), if any."""
        self._socket = sock if callable(getattr(sock, "shutdown", None)) else None
        if self.requested:
            self._shutdown()

    def request(self) -> None:
        self.requested = True
        self._shutdown()

    def _shutdown(self) -> None:
        if self._socket is None or self.draining:
            return
        # OSError: already closed by the peer; nothing more will arrive, the read ends on its own
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_WR)
        self.draining = True


class Upstream:
    """One pooled HTTP client for every generation of this model server, over its fleet of workers
    (:mod:`.fleet`): each stream goes to the least loaded healthy worker, and a worker a stream fails on
    is taken out of rotation until its health probe answers again."""

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
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        c = self.config
        headers = {"authorization": f"Bearer {c.api_key.get_secret_value()}"} if c.api_key else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(c.read_timeout_s, connect=c.connect_timeout_s),
            limits=httpx.Limits(max_connections=c.max_connections, max_keepalive_connections=64),
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
        if self._client is not None:
            await self._client.aclose()
            self._client = None

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

    def stream_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"include_usage": True}
        if self.config.continuous_usage:
            options["continuous_usage_stats"] = True
        return options

    async def prompt_token_ids(self, chat: dict[str, Any]) -> list[int]:
        """The prompt's token ids for ``chat``, asked of a healthy worker (when a stream did not report them)."""
        if self._client is None:
            raise ApiError(ErrorCode.NOT_READY, "the upstream client is not started")
        worker = self.fleet.pick()
        if worker is None:
            raise UpstreamUnavailable(f"no inference worker: {self.config.base_url} resolves to no address")
        try:
            return await self.engine.prompt_token_ids(self._client, worker.base_url, chat)
        except httpx.TransportError as exc:
            self.fleet.failed(worker, str(exc))
            raise UpstreamUnavailable(f"upstream {worker.base_url} failed: {exc}", worker=worker.base_url) from None
        except EngineProtocolError as exc:
            raise ApiError(ErrorCode.UPSTREAM_ERROR, f"upstream {worker.base_url}: {exc}") from None

    async def deltas(
        self, request: EngineRequest, halt: Halt | None = None, prefix_tokens: int = 0
    ) -> AsyncGenerator[Delta]:
        """Stream one generation (the engine adapter's ``request``) from the least loaded worker; closing this
        generator early closes the upstream stream. ``prefix_tokens`` is what the generation already has (for
        the load estimate).

        After ``halt`` is requested the stream is read to its end (see :class:`Halt`): the upstream
        closing it then is the expected end, not an error. Any other failure of the worker (refused,
        reset, broken off, a transient status, an end without ``finish_reason``) marks it down and
        raises :class:`UpstreamUnavailable` naming it.
        """
        if self._client is None:
            raise ApiError(ErrorCode.NOT_READY, "the upstream client is not started")
        worker = self.fleet.pick()
        if worker is None:
            raise UpstreamUnavailable(f"no inference worker: {self.config.base_url} resolves to no address")
        halt = halt or Halt()
        body = request.body
        payload = {**self.config.extra_body, **body, "stream": True, "stream_options": self.stream_options()}
        stream = self.fleet.open(worker, self.fleet.expected(body.get("max_tokens"), prefix_tokens))
        url = worker.base_url + request.path
        network = None
        finished = False

        def down(message: str, details: dict[str, Any] | None = None) -> UpstreamUnavailable:
            self.fleet.failed(worker, message)
            return UpstreamUnavailable(message, details=details, worker=worker.base_url)

        try:
            if self.engine.owns_transport:  # the adapter drives the exchange (llama.cpp: one token per request)
                try:
                    own = EngineRequest(request.path, {**request.body, "extra_body": dict(self.config.extra_body)})
                    async for delta in self.engine.stream(self._client, worker.base_url, own, halt):
                        if delta.token_ids:
                            self.fleet.received(stream, len(delta.token_ids))
                        if delta.finish_reason is not None:
                            finished = True
                        yield delta
                except EngineUnavailable as exc:
                    raise down(f"upstream {worker.base_url}: {exc}", {"upstream_status": exc.status}) from None
                except EngineProtocolError as exc:
                    raise ApiError(ErrorCode.UPSTREAM_ERROR, f"upstream {worker.base_url}: {exc}") from None
                if not finished and not halt.requested:
                    raise down(f"upstream {worker.base_url} ended the generation without a finish_reason")
                return
            async with self._client.stream("POST", url, json=payload) as response:
                if response.status_code != 200:
                    raw = (await response.aread()).decode("utf-8", "replace")
                    message = f"upstream {url} answered {response.status_code}: {raw[:500]}"
                    details = {"upstream_status": response.status_code}
                    if response.status_code in TRANSIENT_STATUS:
                        raise down(message, details)
                    raise ApiError(ErrorCode.UPSTREAM_ERROR, message, details=details)
                network = response.extensions.get("network_stream")
                halt.attach(network.get_extra_info("socket") if network is not None else None)
                try:
                    async for line in response.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[len("data:") :].strip()
                        if data == "[DONE]":
                            return
                        try:
                            chunk = json.loads(data)
                        except json.JSONDecodeError:
                            raise ApiError(
                                ErrorCode.UPSTREAM_ERROR, f"upstream sent a chunk that is not JSON: {data[:200]}"
                            ) from None
                        if isinstance(chunk, dict) and "error" in chunk:
                            raise ApiError(
                                ErrorCode.UPSTREAM_ERROR, f"upstream stream failed: {json.dumps(chunk['error'])[:500]}"
                            )
                        try:
                            delta = self.engine.parse_chunk(chunk)
                        except EngineProtocolError as exc:
                            raise ApiError(ErrorCode.UPSTREAM_ERROR, f"upstream {url}: {exc}") from None
                        if delta.token_ids:
                            self.fleet.received(stream, len(delta.token_ids))
                        if delta.finish_reason is not None:
                            finished = True
                        yield delta
                        if halt.requested and not halt.draining and delta.has_token:
                            return  # nothing to half-close: stop at this token boundary
                    if not finished and not halt.requested:
                        raise down(f"upstream {url} ended the stream without a finish_reason")
                finally:
                    if halt.draining and network is not None:
                        # a half-closed connection must never go back to the pool
                        with contextlib.suppress(Exception):
                            await network.aclose()
        except httpx.HTTPError as exc:
            if halt.draining:
                return  # the upstream ended the stream we asked it to stop: everything it sent is in
            message = f"upstream {url} failed: {type(exc).__name__}: {exc}"
            if isinstance(exc, httpx.TransportError):  # refused, reset, broken off, timed out
                raise down(message) from None
            raise ApiError(ErrorCode.UPSTREAM_ERROR, message) from None
        finally:
            self.fleet.close(stream, prefix_tokens + stream.received if finished else None)
