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
        try:
            async with connection.streams.post(url, json=self.payload(connection, request)) as response:
                await _refuse_unless_ok(response, url)
                transport = response.connection.transport if response.connection is not None else None
                halt.attach(transport.get_extra_info("socket") if transport is not None else None)
                try:
                    async with contextlib.aclosing(_chunks(response)) as chunks:
                        async for chunk in chunks:
                            delta = self.parse_chunk(chunk)
                            yield delta
                            if halt.requested and not halt.draining and delta.has_token:
                                return  # nothing to half-close: stop at this token boundary
                finally:
                    if halt.draining:
                        response.close()  # a half-closed connection must never go back to the pool
        except (aiohttp.ClientError, TimeoutError) as exc:
            if halt.draining:
                return  # the server ended the stream we asked it to stop: everything it sent is in
            # refused, reset, broken off, timed out: the worker's fault
            raise EngineUnavailable(f"{type(exc).__name__}: {exc}") from None


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
    """Every ``data:`` JSON object of the stream, until ``[DONE]``; an error event raises."""
    async with contextlib.aclosing(_lines(response)) as lines:
        async for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[len(b"data:") :].strip()
            if data == b"[DONE]":
                return
            try:
                chunk = json.loads(data)
            except ValueError:  # not JSON, or not UTF-8
                raise EngineProtocolError(f"a chunk that is not JSON: {_text(data)}") from None
            if not isinstance(chunk, dict):
                raise EngineProtocolError(f"a chunk that is not an object: {_text(data)}")
            if "error" in chunk:
                raise EngineError(f"the stream failed: {json.dumps(chunk['error'])[:500]}")
            yield chunk
