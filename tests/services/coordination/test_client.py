"""The control client speaks the control plane's own models on both ends of the wire."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from tests.support.asgi import TOKEN, base_config, serve_many

from gym_services.base.config import load_config
from gym_services.control.models import (
    CaptureRequest,
    CheckpointRef,
    PrepareRequest,
    PrepareResponse,
    StatusResponse,
    StorageGrant,
)
from gym_services.control.protocol import CONTROL_PREFIX, Phase, Role, Verb
from gym_services.coordination.client import ControlClient, ParticipantError, ParticipantRef
from gym_services.resources.counter.app import Config as CounterConfig
from gym_services.resources.counter.app import create_app as counter_app

REF = ParticipantRef("counter", Role.RESOURCES, "http://counter")


async def test_one_typed_method_per_verb_against_a_real_server() -> None:
    app = counter_app(load_config(CounterConfig, overrides=base_config("counter")))
    async with serve_many({"counter": app}) as transport, ControlClient(TOKEN, transport=transport) as client:
        status = await client.status(REF)
        assert isinstance(status, StatusResponse) and status.phase is Phase.FRESH and status.role is Role.RESOURCES
        prepared = await client.prepare(REF, PrepareRequest(checkpoint_id="ck-1", deadline_s=5))
        assert isinstance(prepared, PrepareResponse) and prepared.status is Phase.PREPARED
        with pytest.raises(ParticipantError) as refused:
            await client.prepare(REF, PrepareRequest(checkpoint_id="ck-2", deadline_s=5))
        assert (
            refused.value.status == 409
            and refused.value.code == "checkpoint_busy"
            and refused.value.verb is Verb.PREPARE
        )
        resumed = await client.abort(REF, CheckpointRef(checkpoint_id="ck-1"))
        assert resumed.phase is Phase.OPEN


async def test_requests_carry_the_storage_grant_in_clear_and_answers_are_validated() -> None:
    seen: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, "body": json.loads(request.content)})
        return httpx.Response(200, json={"checkpoint_id": "ck-1"})  # not a CaptureResponse

    access = StorageGrant(token="grant-token-0123456789.signature")
    async with ControlClient(TOKEN, transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ParticipantError, match="malformed CaptureResponse"):
            await client.capture(REF, CaptureRequest(checkpoint_id="ck-1", location="file:///x", storage=access))
        with pytest.raises(TypeError, match="CaptureRequest"):
            await client.capture(REF, CheckpointRef(checkpoint_id="ck-1"))  # type: ignore[arg-type]
    assert seen == [
        {
            "path": f"{CONTROL_PREFIX}/capture",
            "body": {
                "checkpoint_id": "ck-1",
                "location": "file:///x",
                "storage": {"token": "grant-token-0123456789.signature"},
            },
        }
    ]
    assert "signature" not in access.model_dump_json()  # anywhere else the token stays masked


@contextlib.asynccontextmanager
async def listening(app) -> AsyncIterator[str]:
    """``app`` in a real uvicorn server on 127.0.0.1 (an ephemeral port), in this event loop."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):  # bounded: 5 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def test_the_aiohttp_wire_against_a_listening_server() -> None:
    """Without a transport the client speaks aiohttp: the same models, errors and codes as over httpx."""
    app = counter_app(load_config(CounterConfig, overrides=base_config("counter")))
    async with listening(app) as url, ControlClient(TOKEN) as client:
        ref = ParticipantRef("counter", Role.RESOURCES, url)
        assert client._httpx is None
        status = await client.status(ref)
        assert isinstance(status, StatusResponse) and status.phase is Phase.FRESH
        prepared = await client.prepare(ref, PrepareRequest(checkpoint_id="ck-1", deadline_s=5))
        assert prepared.status is Phase.PREPARED
        with pytest.raises(ParticipantError) as refused:
            await client.prepare(ref, PrepareRequest(checkpoint_id="ck-2", deadline_s=5))
        assert refused.value.status == 409 and refused.value.code == "checkpoint_busy"
        assert (await client.abort(ref, CheckpointRef(checkpoint_id="ck-1"))).phase is Phase.OPEN
        async with ControlClient("not-the-token") as stranger:
            with pytest.raises(ParticipantError) as denied:
                await stranger.status(ref)
            assert denied.value.status == 401 and denied.value.code == "unauthorized", denied.value
        assert (await client.status(ref)).phase is Phase.OPEN  # nothing changed


async def test_the_aiohttp_wire_reports_unreachable_and_silent_servers() -> None:
    connections: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await reader.read(1)
        await asyncio.sleep(5)  # never answers

    quiet = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = quiet.sockets[0].getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    nobody = closed.getsockname()[1]
    closed.close()  # bound once, nothing listens there now
    try:
        async with ControlClient(TOKEN) as client:
            with pytest.raises(ParticipantError, match=r"unreachable at http://127\.0\.0\.1:\d+: .*Connect"):
                await client.status(ParticipantRef("gone", Role.RESOURCES, f"http://127.0.0.1:{nobody}"))
            started = time.monotonic()
            with pytest.raises(ParticipantError, match=r"unreachable at .*Timeout"):
                await client.status(ParticipantRef("silent", Role.RESOURCES, f"http://127.0.0.1:{port}"), timeout_s=0.3)
            assert time.monotonic() - started < 4  # the call's own timeout, not the silent server's 5 s
    finally:
        quiet.close()
        for writer in connections:  # the server's side of each connection, which the loop would otherwise leak
            writer.close()
        await quiet.wait_closed()
