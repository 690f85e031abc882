"""What the upstream makes of an SSE engine's answers (``Upstream.deltas`` over ``SseEngine``): a "not now" status
or a stream ended early is the worker's fault (``UpstreamUnavailable`` naming it, the worker out of rotation); a
refusal, an error event or a chunk that is not JSON is an answer the policy model cannot use (``502
upstream_error``, the worker still in rotation). The engine is a scripted Starlette app in process: what it answers
is the point here, not how it generates (the built-in worker and llama-server are tested in their own files)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
from array import array
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from tests.support.http_server import serving

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.tokens import Tokens
from gym_services.models.policy_model.engines import Delta, Halt
from gym_services.models.policy_model.upstream import Upstream, UpstreamConfig, UpstreamUnavailable

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 3}


def chunk(token: int, text: str, finish: str | None = None, prompt: list[int] | None = None) -> str:
    body: dict[str, Any] = {
        "choices": [
            {
                "index": 0,
                "delta": {"content": text},
                "token_ids": [token],
                "logprobs": {"content": [{"token": f"token_id:{token}", "logprob": -0.5}]},
                "finish_reason": finish,
            }
        ]
    }
    if prompt is not None:
        body["prompt_token_ids"] = prompt
    return f"data: {json.dumps(body)}\n\n"


def scripted(status: int, stream: str) -> tuple[Starlette, list[dict[str, Any]]]:
    """An engine answering every chat completions request with ``status`` and ``stream`` as its body (and its
    health probe, ``GET /v1/models``, with 200)."""
    received: list[dict[str, Any]] = []

    async def chat(request: Request) -> Response:
        received.append(await request.json())
        return PlainTextResponse(stream, status_code=status, media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models)]
    return Starlette(routes=routes), received


@contextlib.asynccontextmanager
async def upstream_for(app: Starlette) -> AsyncIterator[Upstream]:
    """An upstream started over the scripted engine, served on 127.0.0.1 in this process."""
    async with serving(app) as root:
        upstream = Upstream(UpstreamConfig(base_url=f"{root}/v1", extra_body={"top_k": 5, "seed": 1}))
        await upstream.start()
        try:
            yield upstream
        finally:
            await upstream.close()


async def run(upstream: Upstream) -> list[Delta]:
    request = upstream.engine.request(CHAT, None, 8)
    async with contextlib.aclosing(upstream.deltas(request, Halt())) as deltas:
        return [delta async for delta in deltas]


def worker_healthy(upstream: Upstream) -> bool:
    (worker,) = upstream.fleet.workers.values()
    return worker.healthy and not worker.streams


async def test_a_finished_stream_is_every_delta_with_the_upstreams_settings_under_the_requests() -> None:
    app, received = scripted(200, chunk(7, "a", prompt=[1, 2]) + chunk(8, "b", "stop") + "data: [DONE]\n\n")
    async with upstream_for(app) as upstream:
        deltas = await run(upstream)
        assert [(d.generation_token_ids, d.text, d.finish_reason) for d in deltas] == [
            ([7], "a", None),
            ([8], "b", "stop"),
        ]
        assert deltas[0].prompt_token_ids == array("I", [1, 2])  # compact: a first chunk's list goes with it
        assert worker_healthy(upstream)
        (worker,) = upstream.fleet.workers.values()
        assert worker.tokens_received == 2
    (sent,) = received
    assert sent["top_k"] == 5 and sent["seed"] == 3  # extra_body under the request's own fields
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


@pytest.mark.parametrize(
    ("status", "stream", "cause"),
    [
        (503, "overloaded", "answered 503"),
        (429, "slow down", "answered 429"),
        (200, chunk(7, "a") + "data: [DONE]\n\n", "without a finish_reason"),
        (200, chunk(7, "a"), "without a finish_reason"),
    ],
)
async def test_a_worker_fault_takes_the_worker_out_of_rotation(status: int, stream: str, cause: str) -> None:
    app, _ = scripted(status, stream)
    async with upstream_for(app) as upstream:
        with pytest.raises(UpstreamUnavailable, match=cause) as failed:
            await run(upstream)
        assert failed.value.worker == upstream.config.base_url
        assert failed.value.details == ({"upstream_status": status} if status != 200 else None)
        assert not worker_healthy(upstream)


@pytest.mark.parametrize(
    ("status", "stream", "cause"),
    [
        (400, '{"error": "bad request"}', "answered 400"),
        (200, 'data: {"error": {"message": "boom"}}\n\n', "the stream failed"),
        (200, "data: {not json\n\n", "not JSON"),
        (200, 'data: {"choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": null}]}\n\n', "no token ids"),
        (200, chunk(7, "a", prompt=[1, True]), "prompt_token_ids must be a list of integer token ids"),
        (200, chunk(7, "a", prompt=[1, 2.0]), "prompt_token_ids must be a list of integer token ids"),
    ],
)
async def test_an_answer_it_cannot_use_is_an_upstream_error(status: int, stream: str, cause: str) -> None:
    app, _ = scripted(status, stream)
    async with upstream_for(app) as upstream:
        with pytest.raises(ApiError, match=cause) as failed:
            await run(upstream)
        assert failed.value.code == ErrorCode.UPSTREAM_ERROR and not isinstance(failed.value, UpstreamUnavailable)
        assert worker_healthy(upstream)


def test_tokens_are_one_value_whatever_sequences_they_came_from() -> None:
    tokens = Tokens.of([1, 2], [7, 8], [-0.5, -1.0])
    assert tokens == Tokens((1, 2), (7, 8), (-0.5, -1.0))
    assert tokens.sequence() == (1, 2, 7, 8)
    assert Tokens.from_fields(tokens.fields()) == tokens
    assert list(tokens.fields()) == ["prompt_token_ids", "generation_token_ids", "generation_log_probs"]
    with pytest.raises(ValueError, match="2 generated token ids but 1 log-probs"):
        Tokens((1,), (2, 3), (-1.0,))


async def test_a_streams_first_chunk_is_not_held_while_its_second_is_awaited() -> None:
    """A first chunk carries the whole prompt's ids: while the stream waits for its next token, neither the chunk
    nor a list of its ids is alive (the delta holds them as a compact array), or thousands of streams starting at
    once would each hold a list of Python ints as long as its prompt."""
    prompt = list(range(1000, 21000))
    second = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield chunk(7, "a", prompt=prompt).encode()
        await second.wait()
        yield (chunk(8, "b", "stop") + "data: [DONE]\n\n").encode()

    async def chat(request: Request) -> Response:
        await request.body()
        return StreamingResponse(body(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    async with upstream_for(app) as upstream:
        request = upstream.engine.request(CHAT, None, 8)
        async with contextlib.aclosing(upstream.deltas(request, Halt())) as deltas:
            first = await anext(deltas)
            assert first.prompt_token_ids == array("I", prompt)
            second_delta = asyncio.create_task(anext(deltas))
            await asyncio.sleep(0.1)  # the reader waits on the socket for the second chunk
            assert not second_delta.done()
            gc.collect()
            held = [o for o in gc.get_objects() if isinstance(o, list) and len(o) == len(prompt) and o is not prompt]
            assert held == []
            second.set()
            assert (await second_delta).finish_reason == "stop"
