"""Engines that answer each generation with one stream of server-sent events (OpenAI's streaming): vLLM's
OpenAI server, and the built-in inference worker, which answers as vLLM does.

:class:`SseEngine` posts the engine's request with ``stream: true``, reads the ``data:`` lines until
``[DONE]`` or the end of the stream, and hands each JSON chunk to the engine's :meth:`~SseEngine.parse_chunk`.
A cut half-closes the connection (:class:`~.base.Halt`) and reads on until the server ends the stream,
so every token the server generated before it saw the stop arrives; a connection that cannot be
half-closed ends at the next token boundary.
"""

from __future__ import annotations

import contextlib
import json
from abc import abstractmethod
from array import array
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from gym_services.models.policy_model.engines.base import (
    TRANSIENT_STATUS,
    Connection,
    Delta,
    Engine,
    EngineError,
    EngineProtocolError,
    EngineRequest,
    EngineUnavailable,
    Halt,
)


class SseEngine(Engine):
    """An engine read as one SSE stream per generation; a subclass says how one chunk reads."""

    @abstractmethod
    def parse_chunk(self, chunk: dict[str, Any]) -> Delta:
        """One SSE ``data:`` JSON object of the stream as a :class:`Delta`; raises
        :class:`EngineProtocolError` when it lacks what the contract needs."""

    def payload(self, connection: Connection, request: EngineRequest) -> dict[str, Any]:
        """The streamed request: the upstream's ``extra_body`` under the request's own fields."""
        options: dict[str, Any] = {"include_usage": True}
        if connection.continuous_usage:
            options["continuous_usage_stats"] = True
        return {**connection.extra_body, **request.body, "stream": True, "stream_options": options}

    async def deltas(self, connection: Connection, request: EngineRequest, halt: Halt) -> AsyncGenerator[Delta]:
        url = connection.base_url + request.path
        body = json_body(self.payload(connection, request))
        try:
            async with connection.streams.post(url, data=body, headers=JSON_HEADERS) as response:
                del body
                await _refuse_unless_ok(response, url)
                transport = response.connection.transport if response.connection is not None else None
                halt.attach(transport.get_extra_info("socket") if transport is not None else None)
                try:
                    async with contextlib.aclosing(_chunks(response)) as chunks:
                        async for chunk in chunks:
                            delta = self.parse_chunk(chunk)
                            del chunk  # not held while the next chunk is awaited (see _chunks)
                            yield delta
                            if halt.requested and not halt.draining and delta.has_token:
                                return  # nothing to half-close: stop at this token boundary
                            del delta
                finally:
                    if halt.draining:
                        response.close()  # a half-closed connection must never go back to the pool
        except (aiohttp.ClientError, TimeoutError) as exc:
            if halt.draining:
                return  # the server ended the stream we asked it to stop: everything it sent is in
            # refused, reset, broken off, timed out: the worker's fault
            raise EngineUnavailable(f"{type(exc).__name__}: {exc}") from None


#: the content type of a request :func:`json_body` wrote
JSON_HEADERS = {"Content-Type": "application/json"}


def json_body(payload: dict[str, Any]) -> bytes:
    """A streamed request's JSON (as aiohttp's ``json=`` writes it), token id arrays written as lists."""
    return json.dumps(payload, default=_listed).encode()


def _listed(value: object) -> list[Any]:
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


async def _refuse_unless_ok(response: aiohttp.ClientResponse, url: str) -> None:
    if response.status == 200:
        return
    raw = (await response.read()).decode("utf-8", "replace")
    message = f"{url} answered {response.status}: {raw[:500]}"
    if response.status in TRANSIENT_STATUS:
        raise EngineUnavailable(message, response.status)
    raise EngineError(message, response.status)


async def _lines(response: aiohttp.ClientResponse) -> AsyncGenerator[bytes]:
    """The body's lines, however long (a first chunk carries the whole prompt's ids: past aiohttp's readline limit)."""
    pending = bytearray()
    async for part in response.content.iter_any():
        pending += part
        del part
        start = 0
        while (end := pending.find(b"\n", start)) != -1:
            yield bytes(pending[start:end])
            start = end + 1
        del pending[:start]
    if pending:
        yield bytes(pending)


def _text(data: bytes) -> str:
    return data[:200].decode("utf-8", "replace")


async def _chunks(response: aiohttp.ClientResponse) -> AsyncGenerator[dict[str, Any]]:
    """Every ``data:`` JSON object of the stream, until ``[DONE]``; an error event raises.

    Neither a line nor its chunk is held while the next line is awaited: a first chunk carries the whole prompt's
    ids (a line of hundreds of KB, a list of as many Python ints, 36 bytes each), and every generation's stream
    would keep its first chunk's until its second token came, thousands of streams at once when a batch of
    rollouts starts (``benchmarks/RESULTS.md``, "A stream's first chunk")."""
    async with contextlib.aclosing(_lines(response)) as lines:
        async for line in lines:
            chunk = _chunk(line)
            del line
            if chunk is _DONE:
                return
            if chunk is not None:
                yield chunk
            del chunk


#: the end of a stream (``data: [DONE]``)
_DONE: dict[str, Any] = {}


def _chunk(line: bytes) -> dict[str, Any] | None:
    """One line's ``data:`` JSON object; None for a line that is not data; :data:`_DONE` at ``[DONE]``."""
    if not line.startswith(b"data:"):
        return None
    data = line[len(b"data:") :].strip()
    if data == b"[DONE]":
        return _DONE
    try:
        chunk = json.loads(data)
    except ValueError:  # not JSON, or not UTF-8
        raise EngineProtocolError(f"a chunk that is not JSON: {_text(data)}") from None
    if not isinstance(chunk, dict):
        raise EngineProtocolError(f"a chunk that is not an object: {_text(data)}")
    if "error" in chunk:
        raise EngineError(f"the stream failed: {json.dumps(chunk['error'])[:500]}")
    return chunk
