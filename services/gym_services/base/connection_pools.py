"""A client's connections in small pools (``docs/decisions.md``, "Clients keep small connection pools").

httpcore's connection pool walks every connection it holds at each request and each response, and again for each
request waiting for a connection, so its cost per request grows with the connections it holds. A policy model with a
thousand streams to its workers in one pool spent most of its event loop there (``benchmarks/token_scale.py`` at
1,024 rollouts), and so does an agent whose thousand episodes each hold a call to the model. A
:class:`PooledTransport` spreads one client's requests over several httpx transports of at most
:data:`POOL_CONNECTIONS` connections each: a request goes to the pool with the fewest requests in flight (a request
is in flight until its response is closed: a stream for its whole life), and a pool is opened when every pool is
full, up to ``max_connections`` in all (None: as many as the callers need). Each pool keeps its connections open
between requests, so a pool's connections are reused rather than opened for each call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import httpx

#: connections of one pool
POOL_CONNECTIONS = 64
#: builds one pool's transport, given how many connections it may hold
PoolFactory = Callable[[int], httpx.AsyncBaseTransport]


def pool_sizes(max_connections: int) -> list[int]:
    """The connections of each pool under a bound: :data:`POOL_CONNECTIONS` each, the last one the rest."""
    full, rest = divmod(max_connections, POOL_CONNECTIONS)
    return [POOL_CONNECTIONS] * full + ([rest] if rest else [])


def _sizes(max_connections: int | None) -> Iterator[int]:
    if max_connections is not None:
        yield from pool_sizes(max_connections)
        return
    while True:
        yield POOL_CONNECTIONS


def http_pool(size: int) -> httpx.AsyncBaseTransport:
    """One pool of real connections: ``size`` at most, every one kept open while idle."""
    return httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=size, max_keepalive_connections=size))


class _Counted(httpx.AsyncByteStream):
    """A response's body that tells its pool once it is closed."""

    def __init__(self, stream: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:
            yield part

    async def aclose(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()
        await self._stream.aclose()


class PooledTransport(httpx.AsyncBaseTransport):
    """Requests spread over pools of at most :data:`POOL_CONNECTIONS` connections (module docstring)."""

    def __init__(self, max_connections: int | None = None, pool: PoolFactory = http_pool) -> None:
        if max_connections is not None and max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._make = pool
        self._next_size = _sizes(max_connections)
        self._pools: list[httpx.AsyncBaseTransport] = []
        self._sizes: list[int] = []
        #: requests in flight in each pool
        self.in_flight: list[int] = []

    @property
    def pools(self) -> int:
        return len(self._pools)

    def _pick(self) -> int:
        """The pool with the fewest requests in flight; a new one when all are full and the bound allows it."""
        best = min(range(len(self.in_flight)), key=self.in_flight.__getitem__, default=None)
        if best is not None and self.in_flight[best] < self._sizes[best]:
            return best
        size = next(self._next_size, None)
        if size is None:  # at the bound: the request waits in the least busy pool for a connection
            assert best is not None
            return best
        self._pools.append(self._make(size))
        self._sizes.append(size)
        self.in_flight.append(0)
        return len(self._pools) - 1

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        index = self._pick()
        self.in_flight[index] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released and index < len(self.in_flight):  # (none after aclose)
                released = True
                self.in_flight[index] -= 1

        try:
            response = await self._pools[index].handle_async_request(request)
        except BaseException:
            release()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Counted(response.stream, release)
        return response

    async def aclose(self) -> None:
        pools, self._pools = self._pools, []
        self._sizes, self.in_flight = [], []
        for pool in pools:
            await pool.aclose()
