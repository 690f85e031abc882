"""The app factory every Gym server uses.

Every server's ``create_app`` calls :func:`create_server_app` with its participant, its own
routes and the :class:`~gym_services.base.metrics.Metrics` its metrics are declared on. The
factory adds what all servers share: JSON errors, liveness and readiness, Prometheus ``/metrics``,
and the checkpoint control plane. Middleware is scoped by ``Mount``: the control routes sit under
one carrying bearer auth (:func:`gym_services.control.routes.control_mount`), the server's own
routes under one (:class:`DataRoutes`) carrying signed session cookies, then admission and fencing.

Endpoints are module-level functions: what they need is on ``app.state`` in a typed holder
(:class:`ServerState` for the factory's own; a server's ``create_app`` puts its own on ``app.state.held``
and its endpoints read it with :func:`held`).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import Scope

from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode, api_error_handler
from gym_services.base.http import BodyLimit
from gym_services.base.logs import get_logger
from gym_services.base.metrics import Metrics
from gym_services.base.nemo_http import NemoHttpError, nemo_error_handler
from gym_services.base.sessions import SessionCodec, SessionMiddleware
from gym_services.control.admission import Admission, PolicyResolver, RoutePolicy, policy_table
from gym_services.control.participant import F, Participant, V
from gym_services.control.plane import ControlPlane
from gym_services.control.protocol import CONTROL_PREFIX
from gym_services.server.control import ServerControl
from gym_services.server.openapi import Operation, openapi_routes

log = get_logger("app")
Hook = Callable[[], Awaitable[None]]
H = TypeVar("H")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = ErrorCode.for_status(exc.status_code)
    message = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
    return ApiError(code, str(message), status=exc.status_code).response()


async def _fastapi_http_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's answer (``{"detail": ...}``, e.g. ``404 Not Found``, ``405 Method Not Allowed`` with its
    ``Allow`` header) everywhere but the control routes, which keep ours."""
    assert isinstance(exc, HTTPException)
    if request.url.path.startswith(CONTROL_PREFIX):
        return await _http_error(request, exc)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


#: NeMo Gym's liveness routes (every server of its framework answers them ``{"status":"ok"}``, ``/`` too)
NEMO_LIVENESS_PATHS = ("/", "/health", "/healthz", "/livez", "/readyz")


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", extra={"path": request.url.path}, exc_info=exc)
    return ApiError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}").response()


class DataRoutes(Mount):
    """The server's own routes, mounted at the root with the middleware that applies to them only.

    Unlike a plain ``Mount("")``, it claims a request only when one of its routes matches the path
    (fully, or all but the method), so unknown paths and the health, metrics and control routes
    never pass through its middleware.
    """

    def __init__(self, routes: Sequence[BaseRoute], middleware: Sequence[Middleware]) -> None:
        super().__init__("", routes=list(routes), middleware=list(middleware))

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.FULL:
            return match, child
        inner = {**scope, **child}
        best = Match.NONE
        for route in self.routes:
            found, _ = route.matches(inner)
            if found is Match.FULL:
                return Match.FULL, child
            if found is Match.PARTIAL:
                best = Match.PARTIAL
        return best, child


def create_server_app(
    config: ServerConfig,
    participant: Participant[V, F],
    routes: Sequence[BaseRoute],
    *,
    metrics: Metrics | None = None,
    admission: Admission | None = None,
    policies: Mapping[str, RoutePolicy] | PolicyResolver | None = None,
    default_policy: RoutePolicy = RoutePolicy.GATED,
    on_startup: Sequence[Hook] = (),
    on_shutdown: Sequence[Hook] = (),
    ready: Callable[[], bool] | None = None,
    nemo_gym: bool = False,
    streamed_paths: tuple[str, ...] = (),
    api: Sequence[Operation] = (),
    api_title: str | None = None,
) -> Starlette:
    """A Starlette app for one Gym server with the control plane mounted.

    ``metrics`` is the registry the server declared its own metrics on (a fresh one when it has
    none); ``admission`` is given by a server whose participant reads it (the agent parks at
    boundaries while it is closed), else made here. A server that stands in for a NeMo Gym server
    (``nemo_gym``) answers as its FastAPI app does where no route of its own does: FastAPI's
    ``{"detail": ...}`` bodies for unknown paths and methods (``404``/``405``), and NeMo Gym's liveness
    routes (``NEMO_LIVENESS_PATHS``, always ``{"status":"ok"}``; readiness stays ``/health/ready``).
    A request body over ``config.max_body_bytes`` is ``413`` before it is read (:class:`BodyLimit`), but under
    ``streamed_paths``, whose routes stream bodies to disk under their own limit. ``api`` describes the
    server's data routes: an OpenAPI 3.1 document generated from their models at ``/openapi.json``, Swagger UI
    at ``/docs`` (:mod:`gym_services.server.openapi`).
    """
    control = ServerControl.build(config, participant, metrics=metrics, admission=admission)
    resolve = policies if callable(policies) else policy_table(policies or {}, default_policy)
    secret = config.session_secret.get_secret_value() if config.session_secret else secrets.token_hex(32)
    codec = SessionCodec(secret, config.name)
    all_routes: list[BaseRoute] = [
        # a NeMo Gym stand-in answers ``/`` as NeMo Gym's liveness route does; the others say who they are
        Route("/", _live if nemo_gym else _root, methods=["GET"]),
        *health_routes(control.metrics),
    ]
    if nemo_gym:
        all_routes += [Route(path, _live, methods=["GET"]) for path in NEMO_LIVENESS_PATHS if path != "/"]
    if api:
        all_routes += openapi_routes(api_title or config.name, list(api))
    all_routes += control.routes()
    data_middleware = [Middleware(SessionMiddleware, codec=codec), *control.admission_middleware(resolve)]
    all_routes.append(DataRoutes(routes, data_middleware))
    app = Starlette(
        routes=all_routes,
        exception_handlers={
            ApiError: api_error_handler,
            NemoHttpError: nemo_error_handler,
            HTTPException: _fastapi_http_error if nemo_gym else _http_error,
            Exception: _internal_error,
        },
        lifespan=_lifespan,
        middleware=[Middleware(BodyLimit, limit=config.max_body_bytes, streamed=tuple(streamed_paths))],
    )
    app.state.server = ServerState(control, ready, tuple(on_startup), tuple(on_shutdown))
    app.state.config = config
    app.state.plane = control.plane
    app.state.participant = participant
    app.state.session_codec = codec
    return app


@dataclass(frozen=True)
class ServerState:
    """What :func:`create_server_app` keeps for its module-level endpoints and lifespan (``app.state.server``)."""

    control: ServerControl
    ready: Callable[[], bool] | None = None
    on_startup: tuple[Hook, ...] = ()
    on_shutdown: tuple[Hook, ...] = ()

    @property
    def config(self) -> ServerConfig:
        return self.control.config

    @property
    def participant(self) -> Participant[Any, Any]:
        return self.control.participant

    @property
    def plane(self) -> ControlPlane[Any, Any]:
        return self.control.plane


def held(request: Request, kind: type[H]) -> H:
    """What a server's ``create_app`` put on ``app.state.held`` for its module-level endpoints (a typed holder)."""
    state = request.app.state.held
    if not isinstance(state, kind):
        raise TypeError(f"app.state.held is {type(state).__name__}, not {kind.__name__}")
    return state


def _server(request: Request) -> ServerState:
    state = request.app.state.server
    assert isinstance(state, ServerState)
    return state


def health_routes(metrics: Metrics) -> list[BaseRoute]:
    """Liveness, readiness and ``/metrics``: their endpoints read the :class:`ServerState` on ``app.state.server``."""
    return [
        Route("/health/live", _live, methods=["GET"]),
        Route("/health/ready", _readiness, methods=["GET"]),
        Route("/metrics", metrics.endpoint, methods=["GET"]),
    ]


async def _root(request: Request) -> JSONResponse:
    server = _server(request)
    return JSONResponse({"status": "ok", "server": server.config.name, "role": server.participant.role})


async def _live(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def _readiness(request: Request) -> JSONResponse:
    server = _server(request)
    if server.ready is not None and not server.ready():
        raise ApiError(ErrorCode.NOT_READY, f"{server.config.name} is not ready yet")
    return JSONResponse({"status": "ready", "phase": server.plane.phase})


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    server: ServerState = app.state.server
    for hook in server.on_startup:
        await hook()
    try:
        async with server.control.running():
            yield
    finally:
        for hook in server.on_shutdown:
            await hook()
