"""Middleware is scoped by Mount: bearer auth on the control routes, sessions and admission on the data routes.

No path list decides what passes admission: health, metrics and control routes are simply not
under the data routes' Mount, and a path no route knows is a 404 even while a checkpoint is open.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.support.asgi import Control, base_config, serve

from gym_services.base.config import ServerConfig, load_config
from gym_services.base.metrics import Metrics
from gym_services.base.sessions import cookie_name
from gym_services.control.participant import NothingToRestore
from gym_services.control.protocol import CONTROL_PREFIX, Role
from gym_services.server.app import create_server_app


class Quiet(NothingToRestore):
    role = Role.RESOURCES


def app(metrics: Metrics | None = None):
    async def bump(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    config = load_config(ServerConfig, overrides=base_config("mounted"))
    return create_server_app(config, Quiet(), [Route("/bump", bump, methods=["POST"])], metrics=metrics)


async def test_only_data_routes_pass_admission_and_get_session_cookies() -> None:
    async with serve(app()) as client:
        control = Control(client)
        first = await client.post("/bump")
        assert first.status_code == 200 and cookie_name("mounted") in first.cookies
        for path in ("/", "/health/live", "/health/ready", "/metrics"):
            infra = await client.get(path)
            assert infra.status_code == 200 and "set-cookie" not in infra.headers, path
        assert "set-cookie" not in (await client.get(f"{CONTROL_PREFIX}/status", headers=control.headers)).headers

        await control.prepare("ck-1")
        parked = await client.post("/bump")
        assert parked.status_code == 409 and parked.json()["error"]["code"] == "checkpoint_parked"
        assert parked.json()["error"]["details"] == {"checkpoint_id": "ck-1", "phase": "prepared"}
        for path in ("/", "/health/live", "/health/ready", "/metrics"):  # never behind admission
            assert (await client.get(path)).status_code == 200, path
        unknown = await client.post("/no-such-route")
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
        await control.resume("ck-1")
        assert (await client.post("/bump")).status_code == 200
        wrong_method = await client.get("/bump")
        assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"


async def test_bearer_auth_guards_every_control_path_and_only_those() -> None:
    async with serve(app()) as client:
        for path in ("/status", "/prepare", "/no-such-verb"):
            refused = await client.post(f"{CONTROL_PREFIX}{path}", json={})
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized", path
        known = await client.post(f"{CONTROL_PREFIX}/no-such-verb", json={}, headers=Control(client).headers)
        assert known.status_code == 404
        assert (await client.post("/bump")).status_code == 200  # no token needed on data routes


async def test_the_server_declares_its_metrics_and_the_factory_exposes_them() -> None:
    metrics = Metrics("mounted")
    own = metrics.counter("gym_mounted_things", "Things the test server counts")
    own.inc(3)
    async with serve(app(metrics)) as client:
        text = (await client.get("/metrics")).text
    assert "gym_mounted_things_total 3.0" in text
    assert (
        "gym_admission_open 1.0" in text and "gym_control_phase_seconds" in text
    )  # the control plane's, same registry
