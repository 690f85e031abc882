"""An httpx transport that routes by host to in-process apps, logs every data call, and can hold one.

Holds are placed on responses: the downstream app has fully handled the request (its
state changed, its own prepare no longer waits), but the caller has not got the reply
yet: the step is "in flight" from the agent's point of view. Header rewrites let a test
present a different seed reply (e.g. a ``wait`` verify mode) without touching a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette

CONTROL_PREFIX = "/ng-control/"


@dataclass
class Call:
    host: str
    path: str
    body: Any
    rollout_id: str | None
    attempt: int | None
    status: int | None = None
    reply: Any = None


@dataclass
class Hold:
    match: Callable[[Call], bool]
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    remaining: int = 1
    call: Call | None = None


class Wire(httpx.AsyncBaseTransport):
    def __init__(self, apps: dict[str, Starlette] | None = None) -> None:
        self.apps: dict[str, Starlette] = dict(apps or {})
        self.calls: list[Call] = []
        self.holds: list[Hold] = []
        self.header_rewrites: list[tuple[Callable[[Call], bool], str, str]] = []
        self.watches: list[tuple[Callable[[Call], bool], asyncio.Event]] = []

    def watch(self, match: Callable[[Call], bool]) -> asyncio.Event:
        """An event set when a matching request is sent (before the server has it)."""
        event = asyncio.Event()
        self.watches.append((match, event))
        return event

    def hold(self, match: Callable[[Call], bool]) -> Hold:
        hold = Hold(match)
        self.holds.append(hold)
        return hold

    def rewrite_header(self, match: Callable[[Call], bool], name: str, value: str) -> None:
        self.header_rewrites.append((match, name.lower(), value))

    def data_calls(self, host: str | None = None, path: str | None = None, ok: bool | None = None) -> list[Call]:
        return [
            c
            for c in self.calls
            if (host is None or c.host == host)
            and (path is None or c.path == path)
            and (ok is None or (c.status is not None and 200 <= c.status < 300) == ok)
        ]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        app = self.apps.get(host)
        if app is None:
            raise httpx.ConnectError(f"no app named {host}", request=request)
        if request.url.path.startswith(CONTROL_PREFIX):
            return await httpx.ASGITransport(app=app).handle_async_request(request)
        try:
            body = json.loads(request.content) if request.content else None
        except ValueError:
            body = request.content
        attempt = request.headers.get("x-ng-attempt")
        call = Call(
            host, request.url.path, body, request.headers.get("x-ng-rollout-id"), int(attempt) if attempt else None
        )
        for match, event in self.watches:
            if match(call):
                event.set()
        response = await httpx.ASGITransport(app=app).handle_async_request(request)
        content = await response.aread()
        call.status = response.status_code
        with contextlib.suppress(ValueError):
            call.reply = json.loads(content)
        self.calls.append(call)
        headers = [(k, v) for k, v in response.headers.multi_items()]
        for match, name, value in self.header_rewrites:
            if match(call):
                headers = [(k, v) for k, v in headers if k.lower() != name] + [(name, value)]
        for hold in self.holds:
            if hold.remaining > 0 and hold.match(call):
                hold.remaining -= 1
                hold.call = call
                hold.arrived.set()
                await hold.release.wait()
                break
        return httpx.Response(response.status_code, headers=headers, content=content, request=request)


@contextlib.asynccontextmanager
async def running(wire: Wire) -> AsyncIterator[Wire]:
    """Run the lifespans of the wire's apps; app ``name`` answers at ``http://name``."""
    async with contextlib.AsyncExitStack() as stack:
        for app in wire.apps.values():
            await stack.enter_async_context(app.router.lifespan_context(app))
        yield wire


def is_call(host: str, path: str, **body: Any) -> Callable[[Call], bool]:
    """Match calls to ``host`` ``path`` whose JSON body has the given top-level values."""

    def match(call: Call) -> bool:
        if call.host != host or call.path != path:
            return False
        return all(isinstance(call.body, dict) and call.body.get(k) == v for k, v in body.items())

    return match
