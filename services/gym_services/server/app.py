"""The app factory every Gym server uses.

It adds what all servers share: JSON errors, signed session cookies, liveness and
readiness, Prometheus ``/metrics``, and the checkpoint control plane (control routes,
admission and fencing in front of the data routes).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Mount, Route

from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode, api_error_handler
from gym_services.base.logs import get_logger
from gym_services.base.metrics import Metrics
from gym_services.base.sessions import SessionCodec, SessionMiddleware
from gym_services.control.admission import AdmissionMiddleware, PolicyResolver, RoutePolicy
from gym_services.control.participant import Participant
from gym_services.control.plane import ControlPlane
from gym_services.control.routes import CONTROL_PREFIX, control_routes

log = get_logger("app")
Hook = Callable[[], Awaitable[None]]


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = ErrorCode.for_status(exc.status_code)
    message = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
    return ApiError(code, str(message), status=exc.status_code).response()


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", extra={"path": request.url.path}, exc_info=exc)
    return ApiError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}").response()


def policy_table(policies: Mapping[str, RoutePolicy], default: RoutePolicy = RoutePolicy.GATED) -> PolicyResolver:
    """Resolve by exact path, then by the longest matching ``prefix*`` entry, else ``default``."""
    prefixes = sorted(((k[:-1], v) for k, v in policies.items() if k.endswith("*")), key=lambda kv: -len(kv[0]))

    def resolve(method: str, path: str) -> RoutePolicy:
        if path in policies:
            return policies[path]
        for prefix, policy in prefixes:
            if path.startswith(prefix):
                return policy
        return default

    return resolve


def create_server_app(
    config: ServerConfig,
    participant: Participant,
    routes: Sequence[BaseRoute],
    *,
    policies: Mapping[str, RoutePolicy] | PolicyResolver | None = None,
    default_policy: RoutePolicy = RoutePolicy.GATED,
    on_startup: Sequence[Hook] = (),
    on_shutdown: Sequence[Hook] = (),
    ready: Callable[[], bool] | None = None,
) -> Starlette:
    """A Starlette app for one Gym server with the control plane mounted."""
    config.require_secrets()
    enabled = config.checkpoint.enabled
    metrics = Metrics(config.name)
    if callable(policies):
        resolve = policies
    else:
        resolve = policy_table(policies or {}, default_policy)
    plane = ControlPlane(config, participant, resolve, metrics)
    secret = config.session_secret.get_secret_value() if config.session_secret else secrets.token_hex(32)
    codec = SessionCodec(secret, config.name)

    async def root(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "server": config.name, "role": participant.role})

    async def live(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readiness(request: Request) -> JSONResponse:
        if ready is not None and not ready():
            raise ApiError(ErrorCode.NOT_READY, f"{config.name} is not ready yet")
        return JSONResponse({"status": "ready", "phase": plane.phase})

    all_routes: list[BaseRoute] = [
        Route("/", root, methods=["GET"]),
        Route("/health/live", live, methods=["GET"]),
        Route("/health/ready", readiness, methods=["GET"]),
        Route("/metrics", metrics.endpoint, methods=["GET"]),
    ]
    if enabled:
        token = config.checkpoint.control_token.get_secret_value()  # type: ignore[union-attr]
        all_routes.append(Mount(CONTROL_PREFIX, routes=control_routes(plane, token)))
    all_routes.extend(routes)

    middleware = [Middleware(SessionMiddleware, codec=codec)]
    if enabled:
        middleware.append(Middleware(AdmissionMiddleware, plane=plane))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        for hook in on_startup:
            await hook()
        await plane.start()
        try:
            yield
        finally:
            await plane.stop()
            for hook in on_shutdown:
                await hook()

    app = Starlette(
        routes=all_routes,
        middleware=middleware,
        exception_handlers={ApiError: api_error_handler, HTTPException: _http_error, Exception: _internal_error},
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.plane = plane
    app.state.metrics = metrics
    app.state.participant = participant
    app.state.session_codec = codec
    return app
