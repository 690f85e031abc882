"""The control routes under :data:`~gym_services.control.protocol.CONTROL_PREFIX`, bearer-token protected.

Mounted by the app factory (:func:`gym_services.server.app.create_server_app`); one route per
:class:`~gym_services.control.protocol.Verb`, taking and answering the models of
:data:`~gym_services.control.models.VERB_MODELS`, handled by the server's
:class:`~gym_services.control.plane.ControlPlane`.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body
from gym_services.control.models import VERB_MODELS
from gym_services.control.plane import ControlPlane
from gym_services.control.protocol import CONTROL_PREFIX, Verb

__all__ = ["CONTROL_PREFIX", "check_token", "control_routes"]


def check_token(request: Request, token: str) -> None:
    """Constant-time comparison of the bearer token; 401 otherwise."""
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise ApiError(ErrorCode.UNAUTHORIZED, "control routes need 'Authorization: Bearer <control token>'")
    if not hmac.compare_digest(presented.strip().encode(), token.encode()):
        raise ApiError(ErrorCode.UNAUTHORIZED, "control token is not valid")


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

    handlers: dict[Verb, Callable[..., Awaitable[BaseModel]]] = {
        Verb.STATUS: status,
        Verb.PREPARE: plane.prepare,
        Verb.COMMIT: plane.commit,
        Verb.RESUME: plane.resume,
        Verb.ABORT: plane.abort,
        Verb.RESTORE: plane.restore,
        Verb.RETIRE: plane.retire,
        Verb.LEASE: plane.lease,
    }
    return [
        Route(verb.path, endpoint(VERB_MODELS[verb][0], handlers[verb]), methods=[verb.method]) for verb in Verb
    ]
