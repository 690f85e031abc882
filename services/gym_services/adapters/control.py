"""The control plane mounted into a Starlette app that was not built by this package (a FastAPI app is one).

:func:`mount_control_plane` does for a finished app what :func:`gym_services.server.app.create_server_app` does
while it builds one, with the same :class:`~gym_services.server.control.ServerControl`: the control routes (under
:data:`~gym_services.control.protocol.CONTROL_PREFIX`, behind the bearer token), ``/health/live``, ``/health/ready``
and ``/metrics`` go before the app's own routes, and the app's own routes (everything else) pass the caller's
``data_middleware`` (a session middleware that sets the session's scope keys, ``base/sessions.py``) and then
admission and attempt fencing. This middleware is the app's innermost (after the app's own, e.g. a framework's
session middleware whose session it reads), so it must be mounted before the app serves its first request. The
control plane starts and stops with the app's lifespan.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_services.base.config import ServerConfig
from gym_services.control.admission import Admission, PolicyResolver
from gym_services.control.participant import Participant
from gym_services.control.plane import ControlPlane
from gym_services.control.protocol import CONTROL_PREFIX
from gym_services.server.app import ServerState, health_routes
from gym_services.server.control import ServerControl

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
    ``admission`` is given by a caller that reads it (else made here)."""
    if not config.checkpoint.enabled:
        raise ValueError(f"server {config.name!r} has checkpointing turned off: nothing to mount")
    if app.middleware_stack is not None:
        raise RuntimeError("mount_control_plane must be called before the app serves a request")
    control = ServerControl.build(config, participant, admission=admission)
    app.router.routes[0:0] = [*control.routes(), *health_routes(control.metrics)]
    app.state.server = ServerState(control)
    skipped = {*SERVED_PATHS, *bypass}

    def bypassed(path: str) -> bool:
        return path in skipped or path == CONTROL_PREFIX or path.startswith(CONTROL_PREFIX + "/")

    # outermost first, as Starlette's own middleware lists: the caller's, then admission and fencing
    chain = [*data_middleware, *control.admission_middleware(policies)]

    def build(inner: ASGIApp) -> ASGIApp:
        for middleware in reversed(chain):
            inner = middleware.cls(inner, *middleware.args, **middleware.kwargs)
        return inner

    app.user_middleware.append(Middleware(DataOnly, build=build, bypass=bypassed))
    _with_lifespan(app, control)
    return control.plane


def _with_lifespan(app: Starlette, control: ServerControl) -> None:
    """The control plane starts after the app's own start-up and stops before its own shutdown."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(running: Any) -> AsyncIterator[Any]:
        async with inner(running) as state, control.running():
            yield state

    app.router.lifespan_context = lifespan


__all__ = ["SERVED_PATHS", "DataOnly", "mount_control_plane"]
