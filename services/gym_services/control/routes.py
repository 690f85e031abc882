"""The control routes under :data:`~gym_services.control.protocol.CONTROL_PREFIX`, behind bearer auth.

The app factory (:func:`gym_services.server.app.create_server_app`) mounts :func:`control_mount`;
its :class:`BearerAuth` middleware guards every route of the ``Mount`` and nothing else. One route
per :class:`~gym_services.control.protocol.Verb`, taking and answering the models of
:data:`~gym_services.control.models.VERB_MODELS`, handled by the server's
:class:`~gym_services.control.plane.ControlPlane`. The coordinator's client
(:mod:`gym_services.coordination.client`) is the other end.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body
from gym_services.control.fencing import LeaderFence
from gym_services.control.models import VERB_MODELS
from gym_services.control.plane import ControlPlane
from gym_services.control.protocol import CONTROL_PREFIX, LEADER_TERM_HEADER, Verb

__all__ = ["BearerAuth", "check_token", "control_mount", "control_routes"]


def check_token(authorization: str, token: str, what: str = "control") -> None:
    """Constant-time comparison of the bearer token; 401 otherwise. ``what`` names the token in the answer."""
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise ApiError(ErrorCode.UNAUTHORIZED, f"{what} routes need 'Authorization: Bearer <{what} token>'")
    if not hmac.compare_digest(presented.strip().encode(), token.encode()):
        raise ApiError(ErrorCode.UNAUTHORIZED, f"{what} token is not valid")


class BearerAuth:
    """Every request of the mount it wraps needs ``Authorization: Bearer <control token>``; one naming a leader's term
    (:data:`~gym_services.control.protocol.LEADER_TERM_HEADER`) must not name an older term than one seen
    (:class:`~gym_services.control.fencing.LeaderFence`)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token
        self.leaders = LeaderFence()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers", []))
            try:
                check_token(headers.get(b"authorization", b"").decode("latin-1"), self.token)
                term = headers.get(LEADER_TERM_HEADER.encode())
                if term is not None:
                    self.leaders.observe(term.decode("latin-1"))
            except ApiError as exc:
                await exc.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def control_routes(plane: ControlPlane[Any, Any]) -> list[Route]:
    def endpoint(
        model: type[BaseModel] | None, verb: Callable[..., Awaitable[BaseModel]]
    ) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def handle(request: Request) -> JSONResponse:
            if model is None:
                result = await verb(request)
            else:
                result = await verb(await parse_body(request, model))
            return JSONResponse(result.model_dump(mode="json"))

        return handle

    async def status(request: Request) -> BaseModel:
        wait = _wait_terminating_s(request)
        if wait is not None:
            await plane.termination.wait_begun(wait)
        return plane.status()

    handlers: dict[Verb, Callable[..., Awaitable[BaseModel]]] = {
        Verb.STATUS: status,
        Verb.PREPARE: plane.prepare,
        Verb.CAPTURE: plane.capture,
        Verb.PERSIST: plane.persist,
        Verb.RESUME: plane.resume,
        Verb.ABORT: plane.abort,
        Verb.RESTORE: plane.restore,
        Verb.RETIRE: plane.retire,
        Verb.LEASE: plane.lease,
    }
    return [Route(verb.path, endpoint(VERB_MODELS[verb][0], handlers[verb]), methods=[verb.method]) for verb in Verb]


#: the longest a status long-poll may wait (``?wait_terminating_s=``)
MAX_STATUS_WAIT_S = 300.0


def _wait_terminating_s(request: Request) -> float | None:
    """``status?wait_terminating_s=N``: answer once the server is terminating, or after N seconds (``docs/protocol.md``,
    "Termination"); ``400 bad_request`` for anything but a number of seconds up to :data:`MAX_STATUS_WAIT_S`."""
    raw = request.query_params.get("wait_terminating_s")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_STATUS_WAIT_S:
        raise ApiError(
            ErrorCode.BAD_REQUEST, f"wait_terminating_s must be seconds from 0 to {MAX_STATUS_WAIT_S:g}, got {raw!r}"
        )
    return seconds


def control_mount(plane: ControlPlane[Any, Any], token: str) -> Mount:
    """The control routes under :data:`CONTROL_PREFIX`, every one behind :class:`BearerAuth`."""
    return Mount(CONTROL_PREFIX, routes=control_routes(plane), middleware=[Middleware(BearerAuth, token=token)])
