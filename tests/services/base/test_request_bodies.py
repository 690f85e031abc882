"""A request body is parsed without the request keeping its bytes (``base/http.py``, ``body_bytes``): a policy model
holds a request for as long as its generation runs and an agent holds ``/run`` for a whole episode, so a body kept
on the request is a second copy of every call in flight (``benchmarks/token_scale.py --heap``)."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from gym_services.base import nemo_http
from gym_services.base.http import body_bytes, read_json


def request_of(chunks: list[bytes], content_type: str = "application/json") -> Request:
    """A Starlette request whose body arrives in ``chunks`` (ASGI ``http.request`` messages)."""
    messages = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": [(b"content-type", content_type.encode())],
        "query_string": b"",
    }
    return Request(scope, receive)


def test_read_json_joins_the_chunks_and_keeps_no_copy() -> None:
    request = request_of([b'{"input": [{"role": "user", ', b'"content": "hi"}], ', b'"tools": []}'])
    assert asyncio.run(read_json(request)) == {"input": [{"role": "user", "content": "hi"}], "tools": []}
    assert not hasattr(request, "_body")  # request.body() would have cached the bytes for the handler's life


def test_read_json_of_an_empty_body() -> None:
    assert asyncio.run(read_json(request_of([b""]))) == {}


def test_nemo_read_body_keeps_no_copy() -> None:
    request = request_of([b'{"responses_create_params": ', b'{"input": "hi"}}'])
    assert asyncio.run(nemo_http.read_body(request)) == {"responses_create_params": {"input": "hi"}}
    assert not hasattr(request, "_body")
    raw = request_of([b"not json"], content_type="text/plain")
    assert asyncio.run(nemo_http.read_body(raw)) == b"not json"  # validated as bytes, as FastAPI does
    assert asyncio.run(nemo_http.read_body(request_of([b""]))) is None


def test_a_body_in_one_piece_is_read_as_that_piece() -> None:
    """An agent's generation reaches its own proxy in process, in one piece: the proxy forwards those very bytes, not
    a copy (Starlette's stream ends with an empty chunk, and joining two pieces would copy them)."""
    body = b'{"input": [{"role": "user", "content": "hi"}], "tools": []}' * 1000
    assert asyncio.run(body_bytes(request_of([body]))) is body
    assert asyncio.run(body_bytes(request_of([body[:10], body[10:]]))) == body
    assert asyncio.run(body_bytes(request_of([b""]))) == b""
