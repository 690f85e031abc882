"""The rollout-collection server (role ``controller``): ``POST /jobs`` starts a collection."""

from __future__ import annotations

import httpx
from pydantic import Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.server.app import create_server_app
from gym_services.base.config import ServerConfig
from gym_services.base.http import parse_body
from gym_services.collection.models import JobSpec
from gym_services.collection.runner import Collection
from gym_services.control.admission import RoutePolicy


class Config(ServerConfig):
    agents: dict[str, str] = Field(default_factory=dict, description="agent name -> base URL")
    default_agent: str | None = None
    request_timeout_s: float = Field(default=3600.0, gt=0)
    transport_retries: int = Field(default=5, ge=0, le=100)


def create_app(config: Config, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    collection = Collection(
        config.agents,
        default_agent=config.default_agent,
        request_timeout_s=config.request_timeout_s,
        transport_retries=config.transport_retries,
        transport=transport,
    )

    async def start(request: Request) -> JSONResponse:
        spec = await parse_body(request, JobSpec)
        return JSONResponse(collection.start(spec).model_dump())

    async def current(request: Request) -> JSONResponse:
        return JSONResponse(collection.status().model_dump())

    return create_server_app(
        config,
        collection,
        [Route("/jobs", start, methods=["POST"]), Route("/jobs/current", current, methods=["GET"])],
        policies={"/jobs/current": RoutePolicy.OPEN},
        on_shutdown=[collection.close],
    )
