"""The adapter on a Starlette app shaped like a NeMo Gym resources server (a signed cookie session holding a
``session_id``, state in a dict keyed by it), in process: which sessions the participant tracks, what a checkpoint
saves, and which late calls are refused. (tests/conformance/test_nemo_gym_adopted.py runs NeMo Gym's own servers.)"""

from __future__ import annotations

import uuid

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.adapters.nemo_gym import SessionDict
from gym_services.adapters.nemo_gym.app import NemoGymConfig, participate
from gym_services.control.participant import Scope


class Counters:
    """The server object: its state in a dict keyed by the session cookie's id."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}


class SessionId:
    """Gives every session an id, as NeMo Gym's framework does."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            scope["session"].setdefault("session_id", uuid.uuid4().hex)
        await self.app(scope, receive, send)


def build() -> tuple[Starlette, Counters, object]:
    server = Counters()

    async def seed(request: Request) -> JSONResponse:
        server.counts[request.session["session_id"]] = (await request.json())["start"]
        return JSONResponse({})

    async def add(request: Request) -> JSONResponse:
        sid = request.session["session_id"]
        server.counts[sid] = server.counts.get(sid, 0) + 1
        return JSONResponse({"count": server.counts[sid]})

    async def verify(request: Request) -> JSONResponse:
        return JSONResponse({"reward": float(server.counts.get(request.session["session_id"]) == 2)})

    routes = (("/seed_session", seed), ("/add", add), ("/verify", verify))
    app = Starlette(
        routes=[Route(path, endpoint, methods=["POST"]) for path, endpoint in routes],
        middleware=[Middleware(SessionMiddleware, secret_key="nemo-style-key"), Middleware(SessionId)],
    )
    config = NemoGymConfig.model_validate(
        {"name": "adopted", "session_secret": "s" * 32, "checkpoint": {"control_token": "t" * 32}}
    )
    plane = participate(app, server, config, SessionDict("counts"))
    return app, server, plane


def headers(attempt: int | None, cookie: dict[str, str] | None = None) -> dict[str, str]:
    sent = {} if attempt is None else {"x-ng-rollout-id": "r1", "x-ng-attempt": str(attempt)}
    if cookie:
        sent["cookie"] = "; ".join(f"{k}={v}" for k, v in cookie.items())
    return sent


async def test_sessions_are_tracked_saved_and_fenced() -> None:
    app, server, plane = build()
    participant = plane.participant
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://adopted") as http:
        seeded = await http.post("/seed_session", json={"start": 1}, headers=headers(0))
        assert seeded.headers["x-ng-checkpoint-verify"] == "wait"
        cookie = dict(http.cookies)
        http.cookies.clear()  # each call below sends the cookie it names
        (sid,) = server.counts
        assert list(participant.sessions) == [sid]
        records = await participant.export(Scope())
        assert [r.key for r in records] == [f"session-{sid}"] and b'"state":1' in records[0].data
        # the episode moves on to attempt 1 (as a restore does): a late call of attempt 0 is refused, with its
        # headers and without any (the session remembers the attempt it was used with)
        plane.admission.fence.advance("r1", 1)
        for attempt in (0, None):
            late = await http.post("/add", headers=headers(attempt, cookie))
            assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
        assert server.counts[sid] == 1  # nothing changed
        added = await http.post("/add", headers=headers(1, cookie))
        assert added.json() == {"count": 2}
        # after the new attempt's call, its own cookie carries attempt 1: calls without headers pass
        renewed = dict(added.cookies)
        assert (await http.post("/verify", json={}, headers=headers(None, renewed))).json() == {"reward": 1.0}
        assert participant.sessions == {}  # a verified episode is in no later checkpoint
        # a call that makes no state tracks nothing
        http.cookies.clear()
        await http.post("/verify", json={})
        assert participant.sessions == {}
