"""One way to start any server: ``gymckpt serve SERVER`` (local stack and Helm chart alike)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from gym_services.base.config import ServerConfig, load_config
from gym_services.server.registry import SERVERS


def server_module(server: str):
    if server not in SERVERS:
        known = ", ".join(sorted(SERVERS))
        raise KeyError(f"unknown server {server!r}; known servers: {known}")
    return importlib.import_module(SERVERS[server])


def build_app(
    server: str, config_path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> tuple[Starlette, ServerConfig]:
    """Load the server's config (file, env, overrides) and build its ASGI app."""
    module = server_module(server)
    config = load_config(module.Config, config_path, overrides, defaults={"name": server})
    return module.create_app(config), config


def run(server: str, config_path: str | None, host: str | None, port: int | None) -> None:
    import uvicorn

    from gym_services.base.logs import configure_logging

    overrides: dict[str, Any] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    app, config = build_app(server, config_path, overrides)
    configure_logging(config.name, config.log_level)
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_config=None,
        timeout_graceful_shutdown=2,
        timeout_keep_alive=30,
        access_log=False,
    )
