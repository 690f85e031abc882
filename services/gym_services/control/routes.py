"""The control routes under ``/ng-control/v1/checkpoint/`` (DESIGN §5), bearer-token protected."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.base.errors import ApiError
from gym_services.base.http import parse_body
from gym_services.control.models import (
    CheckpointRef,
    CommitRequest,
    PrepareRequest,
    RestoreRequest,
    RetireRequest,
)
from gym_services.control.plane import ControlPlane

CONTROL_PREFIX = "/ng-control/v1/checkpoint"


def check_token(request: Request, token: str) -> None:
    """Constant-time comparison of the bearer token; 401 otherwise."""
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise ApiError("unauthorized", "control routes need 'Authorization: Bearer <control token>'")
    if not hmac.compare_digest(presented.strip().encode(), token.encode()):
        raise ApiError("unauthorized", "control token is not valid")


def control_routes(plane: ControlPlane, token: str) -> list[Route]:
    def endpoint(model: type[BaseModel] | None, verb: Callable[..., Awaitable[BaseModel]]):
        async def handle(request: Request) -> JSONResponse:
            check_token(request, token)
            if model is None:
                result = await verb()
            else:
                result = await verb(await parse_body(request, model))
            return JSONResponse(result.model_dump(mode="json"))

        return handle

    async def status() -> BaseModel:
        return plane.status()

    return [
        Route("/status", endpoint(None, status), methods=["GET"]),
        Route("/prepare", endpoint(PrepareRequest, plane.prepare), methods=["POST"]),
        Route("/commit", endpoint(CommitRequest, plane.commit), methods=["POST"]),
        Route("/resume", endpoint(CheckpointRef, plane.resume), methods=["POST"]),
        Route("/abort", endpoint(CheckpointRef, plane.abort), methods=["POST"]),
        Route("/restore", endpoint(RestoreRequest, plane.restore), methods=["POST"]),
        Route("/retire", endpoint(RetireRequest, plane.retire), methods=["POST"]),
        Route("/lease", endpoint(CheckpointRef, plane.lease), methods=["POST"]),
    ]
