"""Every control route over ASGI: auth, phases, idempotency, busy, lease, retire, admission, fencing."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.support.asgi import Control, base_config, serve

from gym_services.base.config import ServerConfig, load_config
from gym_services.control.admission import RoutePolicy
from gym_services.control.participant import NothingToRestore
from gym_services.server.app import create_server_app


class SlowParticipant(NothingToRestore):
    role = "environment"

    def __init__(self) -> None:
        self.busy: set[str] = set()
        self.events: list[str] = []

    def blockers(self):
        from gym_services.control.models import Blocker

        return [Blocker(kind="episode", id=b) for b in sorted(self.busy)]

    async def prepare(self, checkpoint_id):
        self.events.append(f"prepare {checkpoint_id}")

    async def resume(self):
        self.events.append("resume")

    async def abort(self):
        self.events.append("abort")

    async def retire(self, rollout_id, attempt):
        self.events.append(f"retire {rollout_id} {attempt}")
        return True


def make_app(**config):
    participant = SlowParticipant()
    state = {"value": 0}
    gate = asyncio.Event()

    async def slow(request: Request) -> JSONResponse:
        await asyncio.wait_for(gate.wait(), 10)
        state["value"] += 1
        return JSONResponse({"value": state["value"]})

    async def bump(request: Request) -> JSONResponse:
        state["value"] += 1
        return JSONResponse({"value": state["value"]})

    async def peek(request: Request) -> JSONResponse:
        return JSONResponse({"value": state["value"]})

    cfg = load_config(ServerConfig, overrides=base_config("slow", **config))
    app = create_server_app(
        cfg,
        participant,
        [Route("/slow", slow, methods=["POST"]), Route("/bump", bump, methods=["POST"]), Route("/peek", peek)],
        policies={"/peek": RoutePolicy.OPEN},
    )
    return app, participant, state, gate


@pytest.fixture
async def server():
    app, participant, state, gate = make_app()
    async with serve(app) as client:
        yield client, Control(client), participant, state, gate
        gate.set()


async def test_auth_is_required(server) -> None:
    client, _control, *_ = server
    resp = await client.get("/ng-control/v1/checkpoint/status")
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"
    wrong = await Control(client, token="nope").call("status", expect=401)
    assert wrong["error"]["code"] == "unauthorized"
    resp = await client.post("/ng-control/v1/checkpoint/prepare", json={}, headers={"authorization": "Basic x"})
    assert resp.status_code == 401


async def test_bad_bodies_get_400_and_change_nothing(server) -> None:
    client, control, *_ = server
    resp = await client.post("/ng-control/v1/checkpoint/prepare", content=b"{not json", headers=control.headers)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "bad_request"
    bad = await control.call("prepare", {"checkpoint_id": "../x", "deadline_s": 1}, expect=400)
    assert "checkpoint_id" in bad["error"]["message"]
    await control.call("prepare", {"checkpoint_id": "c1", "deadline_s": 1, "extra": 1}, expect=400)
    assert (await control.status())["phase"] == "fresh"


async def test_phases_and_idempotent_repeats(server, tmp_path) -> None:
    client, control, participant, _state, _ = server
    loc = f"file://{tmp_path}"
    assert (await control.status())["phase"] == "fresh"
    first = await control.prepare("c1")
    again = await control.prepare("c1")
    assert first == again and first["status"] == "prepared"
    assert (await control.status())["phase"] == "prepared"
    assert (await client.post("/bump")).status_code == 409
    c1 = await control.capture_persist("c1", loc)
    c2 = await control.capture_persist("c1", loc)
    assert c1 == c2 and c1["records"] == 0
    assert (await control.status())["phase"] == "captured"
    r1 = await control.resume("c1")
    r2 = await control.resume("c1")
    assert r1 == r2 and r1["phase"] == "open"
    assert participant.events == ["prepare c1", "resume"]
    assert (await client.post("/bump")).json() == {"value": 1}


async def test_second_checkpoint_is_busy(server) -> None:
    _, control, *_ = server
    await control.prepare("c1")
    busy = await control.prepare("c2", expect=409)
    assert busy["error"]["code"] == "checkpoint_busy"
    unknown = await control.capture_persist("c2", "file:///tmp/x", expect=404)
    assert unknown["error"]["code"] == "unknown_checkpoint"
    await control.abort("c1")
    assert (await control.prepare("c2"))["status"] == "prepared"


async def test_capture_needs_prepare(server) -> None:
    _, control, *_ = server
    assert (await control.capture_persist("c1", "file:///tmp/x", expect=404))["error"]["code"] == "unknown_checkpoint"
    assert (await control.resume("c9", expect=404))["error"]["code"] == "unknown_checkpoint"


async def test_data_refused_while_open_but_open_routes_served(server) -> None:
    client, control, _, state, _ = server
    await control.prepare("c1")
    refused = await client.post("/bump")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "checkpoint_parked"
    assert 0.02 <= float(refused.headers["retry-after"]) <= 0.1  # the first pause: a 0.1 s guess, less its age
    assert (await client.get("/peek")).json() == {"value": 0}
    assert state["value"] == 0
    await control.abort("c1")
    assert (await client.post("/bump")).status_code == 200


async def test_inflight_request_finishes_before_prepared(server) -> None:
    client, control, _, _state, gate = server
    slow = asyncio.create_task(client.post("/slow"))
    await asyncio.sleep(0.05)
    prepare = asyncio.create_task(control.prepare("c1", deadline_s=5))
    await asyncio.sleep(0.1)
    assert not prepare.done()
    status = await control.status()  # control routes never wait behind data routes
    assert status["phase"] == "preparing" and status["blockers"][0]["id"] == "POST /slow"
    gate.set()
    assert (await slow).json() == {"value": 1}
    assert (await prepare)["status"] == "prepared"


async def test_blockers_reported_at_deadline(server) -> None:
    _, control, participant, *_ = server
    participant.busy.add("rollout-7")
    answer = await control.prepare("c1", deadline_s=0.2)
    assert answer["status"] == "blocked"
    assert answer["blockers"] == [{"kind": "episode", "id": "rollout-7", "detail": "", "server": None}]
    assert (await control.status())["phase"] == "blocked"
    assert (await control.capture_persist("c1", "file:///tmp/x", expect=409))["error"]["code"] == "invalid_phase"
    await control.abort("c1")
    assert participant.events[-1] == "abort"


async def test_lease_expiry_reopens_admission(server) -> None:
    client, control, participant, *_ = server
    await control.prepare("c1", lease_s=0.8)
    assert (await client.post("/bump")).status_code == 409
    await asyncio.sleep(0.4)
    await control.call("lease", {"checkpoint_id": "c1"})
    await asyncio.sleep(0.6)  # past the first lease's end, inside the renewed one
    assert (await control.status())["phase"] == "prepared"  # renewed in time
    await asyncio.sleep(0.8)
    status = await control.status()
    assert status["phase"] == "open" and status["checkpoint_id"] is None
    assert "lease expired" in status["last_event"]
    assert (await client.post("/bump")).status_code == 200
    assert participant.events[-1] == "abort"
    assert (await control.resume("c1"))["phase"] == "open"  # the late resume is harmless


async def test_retire_refused_while_checkpoint_open(server) -> None:
    _, control, participant, *_ = server
    await control.prepare("c1")
    assert (await control.retire("r1", 0, expect=409))["error"]["code"] == "checkpoint_busy"
    await control.resume("c1")
    answer = await control.retire("r1", 0)
    assert answer["retired"] is True and participant.events[-1] == "retire r1 0"


async def test_stale_attempt_is_refused_and_changes_nothing(server) -> None:
    client, control, _, state, _ = server
    new = {"x-ng-rollout-id": "r1", "x-ng-attempt": "1"}
    old = {"x-ng-rollout-id": "r1", "x-ng-attempt": "0"}
    assert (await client.post("/bump", headers=new)).status_code == 200
    stale = await client.post("/bump", headers=old)
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"
    assert state["value"] == 1
    assert (await client.post("/bump", headers={"x-ng-rollout-id": "r1", "x-ng-attempt": "x"})).status_code == 400
    # retiring attempt 1 fences it too
    await control.retire("r1", 1)
    assert (await client.post("/bump", headers=new)).status_code == 409
    assert state["value"] == 1


async def test_metrics_exposed(server) -> None:
    client, control, *_ = server
    await control.prepare("c1")
    await control.abort("c1")
    text = (await client.get("/metrics")).text
    assert 'gym_control_phase_seconds_count{outcome="prepared",verb="prepare"} 1.0' in text
    assert "gym_admission_open 1.0" in text


async def test_json_errors_for_unknown_routes(server) -> None:
    client, *_ = server
    resp = await client.get("/nope")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert (await client.get("/bump")).json()["error"]["code"] == "method_not_allowed"
    assert (await client.get("/health/ready")).json()["status"] == "ready"
