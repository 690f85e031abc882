"""Drive a Starlette app in process, lifespan included."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette

from gym_services.control.protocol import CONTROL_PREFIX

TOKEN = "test-control-token"
#: the collection server's job routes take the control token unless it has a job token of its own
JOB_AUTH = {"authorization": f"Bearer {TOKEN}"}
SECRET = "test-session-secret-0123456789"


def base_config(name: str, **extra) -> dict:
    """Config fields every test server needs."""
    checkpoint = {"control_token": TOKEN, "lease_check_interval_s": 0.05, **extra.pop("checkpoint", {})}
    return {"name": name, "session_secret": SECRET, "checkpoint": checkpoint, **extra}


@contextlib.asynccontextmanager
async def serve(
    app: Starlette, base_url: str = "http://testserver", headers: dict[str, str] | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=base_url, timeout=30, headers=headers) as client:
            yield client


class Control:
    """The control routes of one in-process server."""

    prefix = CONTROL_PREFIX

    def __init__(self, client: httpx.AsyncClient, token: str = TOKEN) -> None:
        self.client = client
        self.headers = {"authorization": f"Bearer {token}"}

    async def call(self, verb: str, body: dict | None = None, expect: int | None = 200) -> dict:
        if verb == "status":
            resp = await self.client.get(f"{self.prefix}/status", headers=self.headers)
        else:
            resp = await self.client.post(f"{self.prefix}/{verb}", json=body or {}, headers=self.headers)
        if expect is not None:
            assert resp.status_code == expect, (verb, resp.status_code, resp.text)
        return resp.json()

    async def status(self) -> dict:
        return await self.call("status")

    async def prepare(
        self, cid: str, deadline_s: float = 5, lease_s: float = 30, final: bool | None = None, **kw
    ) -> dict:
        body = {"checkpoint_id": cid, "deadline_s": deadline_s, "lease_s": lease_s, "final": final}
        return await self.call("prepare", body, **kw)

    async def capture(
        self, cid: str, location: str, episodes: list[str] | None = None, final: bool | None = None, **kw
    ) -> dict:
        body = {"checkpoint_id": cid, "location": location, "episodes": episodes, "final": final}
        return await self.call("capture", body, **kw)

    async def persist(self, cid: str, **kw) -> dict:
        return await self.call("persist", {"checkpoint_id": cid}, **kw)

    async def capture_persist(
        self, cid: str, location: str, episodes: list[str] | None = None, expect: int = 200
    ) -> dict:
        """capture -> persist, both under the pause (the ``sync`` method's order); the persist answer, or the
        capture's answer when it is not ``expect``ed to succeed."""
        captured = await self.capture(cid, location, episodes, expect=expect)
        if expect != 200:
            return captured
        return await self.persist(cid)

    async def resume(self, cid: str, **kw) -> dict:
        return await self.call("resume", {"checkpoint_id": cid}, **kw)

    async def abort(self, cid: str, **kw) -> dict:
        return await self.call("abort", {"checkpoint_id": cid}, **kw)

    async def restore(
        self, cid: str, location: str, manifest_key: str, manifest_sha256: str | None = None, **kw
    ) -> dict:
        body = {"checkpoint_id": cid, "location": location, "manifest_key": manifest_key}
        if manifest_sha256:
            body["manifest_sha256"] = manifest_sha256
        return await self.call("restore", body, **kw)

    async def retire(self, rollout_id: str, attempt: int, **kw) -> dict:
        return await self.call("retire", {"rollout_id": rollout_id, "attempt": attempt}, **kw)

    async def checkpoint(self, cid: str, location: str, episodes: list[str] | None = None) -> dict:
        """prepare -> capture -> persist -> resume (the ``sync`` method's order); returns the persist answer."""
        prepared = await self.prepare(cid)
        assert prepared["status"] == "prepared", prepared
        persisted = await self.capture_persist(cid, location, episodes)
        await self.resume(cid)
        return persisted

    async def checkpoint_background(self, cid: str, location: str, episodes: list[str] | None = None) -> dict:
        """prepare -> capture -> resume -> persist (the ``background`` method); returns the persist answer."""
        prepared = await self.prepare(cid)
        assert prepared["status"] == "prepared", prepared
        await self.capture(cid, location, episodes)
        await self.resume(cid)
        return await self.persist(cid)


class MultiASGITransport(httpx.AsyncBaseTransport):
    """Routes each request to the in-process app named by its host (``http://<name>``)."""

    def __init__(self, apps: dict[str, Starlette]) -> None:
        self.transports = {name: httpx.ASGITransport(app=app, raise_app_exceptions=False) for name, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        transport = self.transports.get(request.url.host)
        if transport is None:
            raise httpx.ConnectError(f"no app named {request.url.host}", request=request)
        return await transport.handle_async_request(request)


@contextlib.asynccontextmanager
async def serve_many(apps: dict[str, Starlette]) -> AsyncIterator[MultiASGITransport]:
    """Run several apps' lifespans; requests to http://<name>/ reach app <name>."""
    async with contextlib.AsyncExitStack() as stack:
        for app in apps.values():
            await stack.enter_async_context(app.router.lifespan_context(app))
        yield MultiASGITransport(apps)
