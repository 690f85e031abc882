"""The one interface between the policy model and an inference engine.

The policy model (:mod:`..generations`, :mod:`..upstream`) knows nothing of any engine's wire format.
Everything engine-specific sits behind :class:`Engine`:

- :meth:`Engine.request` builds the HTTP request of one streamed generation: a fresh one from the
  chat completions body, or the *continuation* of a cut one from its :class:`TokenPrefix`: the prompt
  token ids the engine reported plus the generated token ids kept so far. A continuation is always
  sent as token ids, never as text, so the engine is conditioned on exactly the tokens it sampled;
- :meth:`Engine.parse_chunk` reads one streamed JSON chunk into a :class:`Delta`: the text, the
  token ids with their sampled log-probs, the prompt token ids (when the engine reports them),
  usage and the finish reason;
- :meth:`Engine.prompt_token_ids` is the fallback for an engine whose stream did not report the
  prompt's token ids before a cut (it tokenizes the chat request the way the generation did).

Contract every adapter keeps (the tests in ``tests/services/models/policy_model`` hold the built-in
worker's adapter to it; an adapter for another engine is held to the same):

1. every generated token reaches the policy model as exactly one id in some ``Delta.token_ids``, in
   order, with its sampled log-prob at the same position in ``Delta.log_probs`` (an engine that
   merges a token ending inside a UTF-8 sequence into the next entry must be read so that no id is
   lost, or the adapter refuses to run);
2. ``Delta.text`` is the text those tokens add; the concatenation over a generation and its
   continuations is the generation's text (a token ending inside a multi-byte character may add
   ``""`` and the token completing it the whole character);
3. a continuation request asks for the tokens that follow ``prompt_token_ids + token_ids`` under the
   same sampling settings (seed included), with ``max_tokens`` the remaining budget;
4. the first chunk that can carry them reports the prompt's token ids (``Delta.prompt_token_ids``); a
   continuation's reported prompt is the original prompt + the prefix ids, which the policy model
   strips.

Adapters: :mod:`.vllm` (vLLM's OpenAI server, and the built-in inference worker, which answers as vLLM
does). Pick one with ``upstream.engine`` (:data:`ENGINES` in :mod:`.` maps names to adapters).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import httpx


@dataclass(frozen=True)
class TokenPrefix:
    """Where a cut generation stands, as the engine sampled it.

    ``prompt_token_ids``: the prompt exactly as the engine tokenized it for the first stream;
    ``token_ids`` / ``log_probs``: every token generated so far and its sampled log-prob."""

    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.log_probs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.log_probs)} log-probs")


@dataclass(frozen=True)
class EngineRequest:
    """One streamed HTTP request: ``path`` is relative to the worker's OpenAI base URL (which ends in
    ``/v1``); an absolute path (starting with ``//``) is relative to the server root instead."""

    path: str
    body: dict[str, Any]


@dataclass
class Delta:
    """One streamed chunk, reduced to what the policy model keeps."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None

    @property
    def has_token(self) -> bool:
        return bool(self.token_ids or self.text or self.tool_calls)


class EngineProtocolError(ValueError):
    """The engine answered something this adapter cannot read (a missing id or log-prob, a bad shape)."""


class EngineUnavailable(Exception):
    """The engine answered a status that means "not now" (an adapter that drives its own transport raises
    it; the upstream takes the worker out of rotation as for a refused connection)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Halting(Protocol):
    """What an adapter driving its own transport sees of a cut (``upstream.Halt``)."""

    requested: bool


class Engine(ABC):
    """An inference engine's wire format (see the module docstring for the contract)."""

    #: the name ``upstream.engine`` selects this adapter by
    name: ClassVar[str]

    @abstractmethod
    def request(self, chat: dict[str, Any], prefix: TokenPrefix | None, max_tokens: int | None) -> EngineRequest:
        """The streamed request that generates for ``chat`` (a chat completions body: model, messages,
        tools, sampling settings), continuing after ``prefix`` when given, at most ``max_tokens`` more."""

    @abstractmethod
    def parse_chunk(self, chunk: dict[str, Any]) -> Delta:
        """One SSE ``data:`` JSON object of the stream as a :class:`Delta`; raises
        :class:`EngineProtocolError` when it lacks what the contract needs."""

    async def prompt_token_ids(self, client: httpx.AsyncClient, base_url: str, chat: dict[str, Any]) -> list[int]:
        """The prompt's token ids for ``chat`` when the stream did not report them (``base_url`` ends in /v1)."""
        raise EngineProtocolError(f"the {self.name} adapter cannot tokenize a prompt on its own")

    #: True for an adapter that drives the HTTP exchange itself (:meth:`stream`) instead of one SSE stream
    #: per request read with :meth:`parse_chunk`
    owns_transport: ClassVar[bool] = False

    def stream(
        self, client: httpx.AsyncClient, base_url: str, request: EngineRequest, halt: Halting
    ) -> AsyncIterator[Delta]:
        """The deltas of ``request`` (``owns_transport`` adapters only): ends after the delta with a
        ``finish_reason``, or at a token boundary once ``halt.requested`` (nothing the engine generated
        is dropped). Raises ``httpx.TransportError`` / :class:`EngineUnavailable` for a failing worker,
        :class:`EngineProtocolError` for an answer it cannot read."""
        raise NotImplementedError(f"the {self.name} adapter reads one SSE stream per request")
