"""The control plane mounted into a Starlette app that was not built by this package (a FastAPI app is one).

:func:`mount_control_plane` does for a finished app what :func:`gym_services.server.app.create_server_app` does
while it builds one: it adds the control routes (under :data:`~gym_services.control.protocol.CONTROL_PREFIX`,
behind the bearer token), ``/health/live``, ``/health/ready`` and ``/metrics`` before the app's own routes, and
wraps the app's own routes (everything else) in admission and attempt fencing
(:class:`~gym_services.control.admission.AdmissionMiddleware`) and whatever ``data_middleware`` the caller adds.
Its middleware is the app's innermost (after the app's own, e.g. a session middleware whose session it reads),
so it must be called before the app serves its first request. The control plane starts and stops with the app's
lifespan.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_services.base.config import ServerConfig
from gym_services.base.metrics import Metrics
from gym_services.control.admission import Admission, AdmissionMiddleware, PolicyResolver
from gym_services.control.metrics import ControlMetrics
from gym_services.control.participant import Participant
from gym_services.control.plane import ControlPlane
from gym_services.control.protocol import CONTROL_PREFIX
from gym_services.control.routes import control_mount

#: the paths this module adds besides the control routes
SERVED_PATHS = ("/health/live", "/health/ready", "/metrics")


class DataOnly:
    """Sends the app's own routes through ``data`` (admission, fencing, ...) and the paths in ``bypass`` (the
    control plane's, health, metrics, liveness) straight to the app."""

    def __init__(self, app: ASGIApp, build: Callable[[ASGIApp], ASGIApp], bypass: Callable[[str], bool]) -> None:
        self.app = app
        self.data = build(app)
        self.bypass = bypass

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.bypass(scope["path"]):
            await self.data(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def mount_control_plane(
    app: Starlette,
    config: ServerConfig,
    participant: Participant[Any, Any],
    *,
    policies: PolicyResolver,
    data_middleware: Sequence[Middleware] = (),
    bypass: Sequence[str] = (),
    admission: Admission | None = None,
) -> ControlPlane[Any, Any]:
    """Make ``app`` a participant: see the module. ``policies`` says how each data route behaves while a
    checkpoint is open; ``bypass`` names more paths that are not data routes (a framework's liveness routes);
    ``admission`` is given by a caller whose middleware reads its attempt fence (else made here)."""
    config.require_secrets()
    if config.checkpoint.control_token is None:  # require_secrets refused it unless checkpointing is off
        raise ValueError(f"server {config.name!r} has checkpointing turned off: nothing to mount")
    metrics = Metrics(config.name)
    control_metrics = ControlMetrics.declare(metrics)
    metrics.track_live(participant.live)
    admission = admission if admission is not None else Admission(config.participant_id)
    plane: ControlPlane[Any, Any] = ControlPlane(config, participant, control_metrics, admission)

    async def live(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ready", "phase": plane.phase})

    app.router.routes[0:0] = [
        control_mount(plane, config.checkpoint.control_token.get_secret_value()),
        Route("/health/live", live, methods=["GET"]),
        Route("/health/ready", ready, methods=["GET"]),
        Route("/metrics", metrics.endpoint, methods=["GET"]),
    ]
    skipped = {*SERVED_PATHS, *bypass}

    def bypassed(path: str) -> bool:
        return path in skipped or path == CONTROL_PREFIX or path.startswith(CONTROL_PREFIX + "/")

    def build(inner: ASGIApp) -> ASGIApp:
        for middleware in reversed(list(data_middleware)):
            inner = middleware.cls(inner, *middleware.args, **middleware.kwargs)
        assert admission is not None
        return AdmissionMiddleware(inner, admission=admission, resolve=policies, refused=control_metrics.refused)

    if app.middleware_stack is not None:
        raise RuntimeError("mount_control_plane must be called before the app serves a request")
    app.user_middleware.append(Middleware(DataOnly, build=build, bypass=bypassed))
    _with_lifespan(app, plane)
    return plane


def _with_lifespan(app: Starlette, plane: ControlPlane[Any, Any]) -> None:
    """The control plane starts after the app's own start-up and stops before its own shutdown."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(running: Any) -> AsyncIterator[Any]:
        async with inner(running) as state:
            await plane.start()
            try:
                yield state
            finally:
                await plane.stop()

    app.router.lifespan_context = lifespan


__all__ = ["SERVED_PATHS", "DataOnly", "mount_control_plane"]
