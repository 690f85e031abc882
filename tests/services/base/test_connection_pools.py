"""A client's connections in small pools (``base/connection_pools.py``): requests spread over pools of at most
``POOL_CONNECTIONS`` connections, the least busy first, a pool opened only when every one is full, up to the bound;
a streamed response holds its pool's place until it is closed. Against a real inference worker process, and, for
the placement rules, pools that are in-process apps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.services.models.procs import ServerProcess, running

from gym_services.base.connection_pools import POOL_CONNECTIONS, PooledTransport, pool_sizes

CHAT = {"model": "ipi-follow", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5}


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real inference worker, slow enough (1 token a second: a stream of 5 tokens lasts 5 s) that every stream of a
    round is open at once, even on a busy machine."""
    config = {"tokens_per_second": 1, "time_to_first_token_s": 0.05}
    with running("inference_worker", config, tmp_path_factory.mktemp("worker")) as proc:
        yield proc


def test_a_bound_splits_into_pools_of_at_most_pool_connections() -> None:
    assert pool_sizes(4096) == [POOL_CONNECTIONS] * (4096 // POOL_CONNECTIONS)
    assert pool_sizes(130) == [POOL_CONNECTIONS, POOL_CONNECTIONS, 2] and pool_sizes(3) == [3]
    with pytest.raises(ValueError, match="at least 1"):
        PooledTransport(0)


def in_process(opened: list[int]):
    """Pools that are an in-process app answering at once; ``opened`` gets each pool's size."""

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"path": request.url.path})

    app = Starlette(routes=[Route("/{name}", echo)])

    def pool(size: int) -> httpx.AsyncBaseTransport:
        opened.append(size)
        return httpx.ASGITransport(app=app)

    return pool


async def test_streams_fill_the_least_busy_pool_and_a_pool_opens_only_when_all_are_full() -> None:
    opened: list[int] = []
    transport = PooledTransport(2 * POOL_CONNECTIONS + 2, pool=in_process(opened))
    async with httpx.AsyncClient(transport=transport, base_url="http://pools.test") as client:
        streams = []
        for i in range(POOL_CONNECTIONS + 1):
            streams.append(await client.send(client.build_request("GET", f"/{i}"), stream=True))
        assert opened == [POOL_CONNECTIONS, POOL_CONNECTIONS] and transport.in_flight == [POOL_CONNECTIONS, 1]
        await streams.pop().aclose()
        assert transport.in_flight == [POOL_CONNECTIONS, 0]
        for i in range(POOL_CONNECTIONS + 2):  # the second pool fills, then the last one (the rest: 2)
            streams.append(await client.send(client.build_request("GET", f"/{i}"), stream=True))
        assert opened == [POOL_CONNECTIONS, POOL_CONNECTIONS, 2] and transport.in_flight == [64, 64, 2]
        extra = await client.send(client.build_request("GET", "/over"), stream=True)  # at the bound: no new pool
        assert len(opened) == 3 and sum(transport.in_flight) == 2 * POOL_CONNECTIONS + 3
        assert json.loads(await extra.aread()) == {"path": "/over"}  # read whole: closed, its place freed
        for stream in streams:
            await stream.aclose()
            await stream.aclose()  # closing twice frees one place
        assert transport.in_flight == [0, 0, 0]
        assert (await client.get("/plain")).json() == {"path": "/plain"} and transport.in_flight == [0, 0, 0]


async def test_a_request_that_fails_frees_its_place() -> None:
    def refusing(size: int) -> httpx.AsyncBaseTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("refused", request=request)

        return httpx.MockTransport(handler)

    transport = PooledTransport(pool=refusing)
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(3):
            with pytest.raises(httpx.ConnectError):
                await client.get("http://pools.test/x")
    assert transport.pools == 0  # closed with the client


async def test_unbounded_pools_carry_every_stream_of_a_real_server_and_keep_their_connections(
    worker: ServerProcess,
) -> None:
    """150 streams at once to a real inference worker: three pools (64, 64, 22), every stream answered whole; a
    second round of 150 reuses the connections the first opened (each pool keeps its own open while idle)."""
    transport = PooledTransport()
    async with httpx.AsyncClient(transport=transport, base_url=worker.url, timeout=60) as client:

        async def stream() -> str:
            async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
                assert response.status_code == 200
                return "".join([line async for line in response.aiter_lines()])

        def connections() -> list[list[object]]:
            return [list(pool._pool.connections) for pool in transport._pools]  # type: ignore[attr-defined]

        answers = await asyncio.gather(*(stream() for _ in range(150)))
        assert all(answer.endswith("data: [DONE]") for answer in answers)
        assert transport.pools == 3 and transport.in_flight == [0, 0, 0]
        first = connections()
        assert [len(held) for held in first] == [64, 64, 22]  # pools opened as they filled
        answers = await asyncio.gather(*(stream() for _ in range(150)))
        assert all(answer.endswith("data: [DONE]") for answer in answers)
        assert transport.pools == 3 and transport.in_flight == [0, 0, 0]
        # the second round spread its streams over the three pools (the least busy first, 50 each): the first two
        # took theirs from the connections the first round left open, the third opened only the 28 it lacked
        kept = {id(c) for held in first for c in held}
        opened = [sum(1 for c in held if id(c) not in kept) for held in connections()]
        assert opened == [0, 0, 28], opened
