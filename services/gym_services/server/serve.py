"""One way to start any server: ``gymckpt serve SERVER`` (local stack and Helm chart alike), ``SERVER`` a shipped
server, one an installed package registers, or an import path (:mod:`gym_services.server.sources`).

Called by the CLI (:mod:`gym_services.cli`); tests and the benchmarks build apps with :func:`build_app`.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_services.base.config import ServerConfig, load_config
from gym_services.control.termination import Termination
from gym_services.server.control import ServerControl
from gym_services.server.sources import load


def build_app(
    server: str, config_path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> tuple[Starlette, ServerConfig]:
    """Load the server's config (file, env, overrides) and build its ASGI app. ``server``: a name or an import path
    (:mod:`gym_services.server.sources`); :class:`~gym_services.server.sources.UnknownServer` when nothing provides
    it."""
    factory = load(server)
    config = load_config(factory.config_class, config_path, overrides, defaults={"name": factory.source.default_name})
    return factory.create_app(config), config


#: what the control port serves besides the control routes (probes and scraping work on either port)
CONTROL_PORT_PATHS = ("/health/live", "/health/ready", "/metrics")


def split_ports(app: ASGIApp, data_port: int, control_port: int) -> ASGIApp:
    """Serve the control routes only on ``control_port`` and the data routes only on ``data_port``.

    With its own port, the control plane can be fenced off by a NetworkPolicy (the operator only) while
    the data routes stay open to the stack. The local socket's port decides; a request on the wrong port
    gets 404 ``not_found`` naming the right one."""
    from gym_services.base.errors import ApiError, ErrorCode
    from gym_services.control.protocol import CONTROL_PREFIX

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            local_port = (scope.get("server") or (None, None))[1]
            control = path == CONTROL_PREFIX or path.startswith(CONTROL_PREFIX + "/")
            if local_port == data_port and control:
                response = ApiError(ErrorCode.NOT_FOUND, f"control routes are served on port {control_port}")
                await response.response()(scope, receive, send)
                return
            if local_port == control_port and not control and path not in CONTROL_PORT_PATHS:
                response = ApiError(
                    ErrorCode.NOT_FOUND,
                    f"port {control_port} serves only {CONTROL_PREFIX}/*; data routes are on port {data_port}",
                )
                await response.response()(scope, receive, send)
                return
        await app(scope, receive, send)

    return wrapped


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run(
    server: str,
    config_path: str | None,
    host: str | None,
    port: int | None,
    control_port: int | None = None,
    drain_timeout_s: float = 2.0,
    fd: int | None = None,
    termination_grace_s: float | None = None,
) -> None:
    """Serve one server; with ``control_port``, the control routes get their own port (see :func:`split_ports`).

    On SIGTERM a checkpoint participant with a termination grace (``termination_grace_s``, else its config's
    ``checkpoint.termination_grace_s``) keeps serving and holding its state until its part of a final checkpoint is
    persisted or the grace ends (:class:`TerminatingServer`), and a backend with one (no participant, whether its app
    has a control plane or not: :func:`backend_termination`) until the deadline or a later SIGINT; without one, and
    on a first SIGINT, requests in flight get ``drain_timeout_s`` to finish (a tool call, a generation) before exit.

    ``fd`` is a listening socket the caller bound and passed down (the local stack's launcher): no other
    process can take its port between the launcher choosing it and this server starting."""
    import uvicorn

    from gym_services.base.logs import configure_logging, get_logger
    from gym_services.server.allocator import Trimmer, tune_allocator
    from gym_services.server.terminating import TerminatingServer

    tuned = tune_allocator()
    overrides: dict[str, Any] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    if termination_grace_s is not None:
        overrides["checkpoint"] = {"termination_grace_s": termination_grace_s}
    app, config = build_app(server, config_path, overrides)
    configure_logging(config.name, config.log_level)
    if tuned:
        get_logger("server").info("allocator tuned", extra={"allocator": tuned})
    if Trimmer.start(config.memory_trim_interval_s) is not None:
        get_logger("server").info(
            "allocator's free pages given back periodically", extra={"every_s": config.memory_trim_interval_s}
        )
    options: dict[str, Any] = dict(
        log_config=None, timeout_graceful_shutdown=drain_timeout_s, timeout_keep_alive=30, access_log=False
    )
    control = _control(app)
    served: ASGIApp = app
    if fd is not None:
        if control_port is not None:
            raise ValueError("--fd serves one port; give --control-port without --fd")
        sockets = [socket.socket(fileno=fd)]
    elif control_port is None or control_port == config.port:
        sockets = [_listen(config.host, config.port)]
    else:
        sockets = [_listen(config.host, config.port), _listen(config.host, control_port)]
        served = split_ports(app, config.port, control_port)
    termination = control.plane.termination if control is not None else backend_termination(config)
    live = control.participant.live if control is not None and config.checkpoint.enabled else None
    counters = control.metrics.counter_totals if control is not None else None
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # started with SIGINT ignored (a background job of a script): a server stops at SIGINT all the same (uvicorn
        # takes it while serving), and then says so as at any SIGINT (`interrupted`, exit 130), not as a clean exit
        signal.signal(signal.SIGINT, signal.default_int_handler)
    TerminatingServer(uvicorn.Config(served, **options), termination, live, counters).run(sockets=sockets)


def _control(app: ASGIApp) -> ServerControl | None:
    """The server's control plane as its app carries it (``create_server_app``'s, or an adopted app's): its
    termination (without a grace, SIGTERM stops the server at once), its participant's live counts and its metrics,
    logged when it exits. None for an app without one (:func:`backend_termination`)."""
    server = getattr(getattr(app, "state", None), "server", None)
    control = getattr(server, "control", None)
    return control if isinstance(control, ServerControl) else None


def backend_termination(config: ServerConfig) -> Termination:
    """The termination of a server whose app has no control plane (a plain Starlette app: the Lean sandbox stand-in,
    a server named by import path): a backend's, holding no state. With its config's grace it keeps serving after
    SIGTERM until the deadline or a later SIGINT, as any backend does, so a participant calling it meanwhile (a
    proof verified in the sandbox just before the final checkpoint) gets its usual answer, not a refused
    connection that the checkpoint would keep as the episode's result (``docs/protocol.md``, "Termination")."""
    return Termination(config.checkpoint.termination_grace_s, holds_state=False)
