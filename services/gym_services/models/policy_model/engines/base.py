"""The one interface between the policy model and an inference engine.

The policy model (:mod:`..generations`, :mod:`..upstream`) knows nothing of any engine's wire format.
Everything engine-specific sits behind :class:`Engine`, in one mode for every engine:

- :meth:`Engine.request` plans one generation: a fresh one from the chat completions body, or the
  *continuation* of a cut one from its :class:`~gym_services.base.tokens.Tokens`: the prompt token ids
  the engine reported plus the generated token ids kept so far. A continuation is always sent as token
  ids, never as text, so the engine is conditioned on exactly the tokens it sampled;
- :meth:`Engine.deltas` runs that plan against one worker (a :class:`Connection`) and yields what it
  generates as :class:`Delta` s: the text, the generated ids with their sampled log-probs, the prompt's
  ids (when the engine reports them), usage and the finish reason. It stops early when a cut asks it to
  (:class:`Halt`), losing nothing the engine generated;
- :meth:`Engine.prompt_token_ids` tokenizes a chat request when a stream was cut before it reported the
  prompt's ids.

How an engine moves bytes is its own: the SSE engines (:mod:`.sse`: vLLM and the built-in worker, which
answers as vLLM does) read one server-sent-event stream per generation; llama.cpp's adapter
(:mod:`.llama_cpp`) drives llama-server's native route one token per request. The upstream
(:mod:`..upstream`) picks the worker, counts the load and turns the errors below into the policy
model's: :class:`EngineUnavailable` and ``httpx.TransportError`` are the worker's fault (it is taken out
of rotation and the generation continues elsewhere or later), :class:`EngineError` is an answer the
policy model cannot use (``502 upstream_error``). The SSE engines read through aiohttp
(:attr:`Connection.streams`) and turn its failures into :class:`EngineUnavailable`; requests with one answer go
through the httpx client (:attr:`Connection.client`).

Contract every adapter keeps (the tests in ``tests/services/models/policy_model`` hold the built-in
worker's adapter to it, ``tests/services/models/llama_cpp`` llama.cpp's):

1. every generated token reaches the policy model as exactly one id in some
   ``Delta.generation_token_ids``, in order, with its sampled log-prob at the same position in
   ``Delta.generation_log_probs`` (an engine that merges a token ending inside a UTF-8 sequence into the
   next entry must be read so that no id is lost, or the adapter refuses to run);
2. ``Delta.text`` is the text those tokens add; the concatenation over a generation and its
   continuations is the generation's text (a token ending inside a multi-byte character may add
   ``""`` and the token completing it the whole character);
3. a continuation asks for the tokens that follow ``Tokens.sequence()`` under the same sampling settings
   (seed included), with ``max_tokens`` the remaining budget;
4. the first delta that can carry them reports the prompt's token ids (``Delta.prompt_token_ids``); a
   continuation's reported prompt is the original prompt + the prefix ids, which the policy model
   strips;
5. :meth:`Engine.deltas` ends after the delta with a ``finish_reason``, or, once the :class:`Halt` is
   requested, at a token boundary with every token the engine generated delivered.

Pick an adapter with ``upstream.engine`` (:data:`ENGINES` in :mod:`.` maps names to adapters).
"""

from __future__ import annotations

import contextlib
import socket
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp
import httpx

from gym_services.base.tokens import Tokens

#: statuses that say "not now" rather than "not this request": the worker is taken out of rotation
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class EngineRequest:
    """One generation as its engine plans it: ``body`` is the engine's own (an SSE engine's JSON request, the
    llama.cpp adapter's plan of steps); ``path`` is the route an SSE engine posts it to, relative to the
    worker's OpenAI base URL (which ends in ``/v1``)."""

    path: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Connection:
    """One worker as an engine reaches it: the pooled client (requests with one answer), the streaming session (SSE
    streams: aiohttp, whose reads cost less than half of httpx's per chunk, ``docs/decisions.md``, "The policy
    model reads its streams with aiohttp"), the worker's OpenAI base URL (ending in ``/v1``), and the upstream's
    settings every request carries."""

    client: httpx.AsyncClient
    streams: aiohttp.ClientSession
    base_url: str
    #: ``upstream.extra_body``: under every request's own fields
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    #: ``upstream.continuous_usage``: usage on every chunk (vLLM's ``continuous_usage_stats``)
    continuous_usage: bool = True

    @property
    def root(self) -> str:
        """The server root (the base URL without ``/v1``)."""
        return self.base_url.removesuffix("/").removesuffix("/v1")


@dataclass
class Delta:
    """One streamed step of a generation, reduced to what the policy model keeps."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    generation_token_ids: list[int] = field(default_factory=list)
    generation_log_probs: list[float] = field(default_factory=list)
    #: the prompt's ids (a compact array where the engine reads them from a stream's first chunk)
    prompt_token_ids: Sequence[int] | None = None

    @property
    def has_token(self) -> bool:
        return bool(self.generation_token_ids or self.text or self.tool_calls)


class EngineError(Exception):
    """The engine answered something the policy model cannot use: a refusal of the request, an error in the
    stream (``status``: the HTTP status, when there was one)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class EngineProtocolError(EngineError, ValueError):
    """The engine answered something this adapter cannot read (a missing id or log-prob, a bad shape)."""


class EngineUnavailable(Exception):
    """The worker answered "not now" (a transient status) or ended a generation early: the worker's fault,
    not the request's; the upstream takes it out of rotation as for a refused connection."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Halt:
    """Asks one generation to stop while what the engine already generated keeps arriving.

    An engine with nothing in flight between tokens (llama.cpp's, one request per token) stops before
    its next step once :attr:`requested`. An SSE engine :meth:`attach` es its connection's socket, and
    :meth:`request` closes the socket's sending half (a TCP half-close): a server behind uvicorn (vLLM,
    the built-in worker) takes the end of the request stream as the client leaving and stops generating;
    every token it wrote before noticing still arrives, because the engine keeps reading until the server
    ends the stream (:attr:`draining`). A cut therefore keeps every token the engine generated, however
    far the reader had fallen behind. Without a socket to half-close, an SSE stream ends at the next
    token instead, as a plain close would.
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


class Engine(ABC):
    """An inference engine's wire format (see the module docstring for the contract)."""

    #: the name ``upstream.engine`` selects this adapter by
    name: ClassVar[str]

    @abstractmethod
    def request(self, chat: dict[str, Any], prefix: Tokens | None, max_tokens: int | None) -> EngineRequest:
        """The generation for ``chat`` (a chat completions body: model, messages, tools, sampling settings),
        continuing after ``prefix`` when given, at most ``max_tokens`` more."""

    @abstractmethod
    def deltas(self, connection: Connection, request: EngineRequest, halt: Halt) -> AsyncGenerator[Delta]:
        """Run ``request`` on the worker behind ``connection``: every delta until the one with a
        ``finish_reason``, or, once ``halt`` is requested, until a token boundary with nothing the engine
        generated dropped. Raises :class:`EngineUnavailable` (or, through the httpx client, ``httpx.TransportError``)
        for a failing worker and :class:`EngineError` for an answer it cannot use."""

    async def prompt_token_ids(self, connection: Connection, chat: dict[str, Any]) -> list[int]:
        """The prompt's token ids for ``chat`` when the stream did not report them."""
        raise EngineProtocolError(f"the {self.name} adapter cannot tokenize a prompt on its own")
