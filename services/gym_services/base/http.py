"""Request bodies: parsing that turns every malformed input into a 400, never a 500, and the size limit
(:class:`BodyLimit`, put in front of every server by the app factory).

The parsing is used by the control routes and by the data routes of servers that answer in our own error form.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_services.base.errors import ApiError, ErrorCode

M = TypeVar("M", bound=BaseModel)


async def body_bytes(request: Request) -> bytes:
    """The request body, read without keeping it on the request (``request.body()`` would): a handler holds its
    request for as long as it runs (a policy model's generation, an agent's whole episode), and once parsed the
    bytes are only a second copy of what it holds (``benchmarks/token_scale.py --heap`` shows them). The body can
    be read once. A body that came in one piece is that piece, not a copy (Starlette's stream ends with an empty
    chunk, and joining two pieces copies them): an agent's generation reaches its own proxy in process, and the
    proxy forwards those very bytes."""
    return b"".join([chunk async for chunk in request.stream() if chunk])


async def read_json(request: Request) -> Any:
    """The request body as JSON; an empty body is ``{}``."""
    return parse_json(await body_bytes(request))


def parse_json(raw: bytes) -> Any:
    """A request body's bytes as JSON (``400 bad_request`` when they are not); empty bytes are ``{}``."""
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(ErrorCode.BAD_REQUEST, f"request body is not valid JSON: {exc}") from None


def validate(model: type[M], data: Any) -> M:
    """Validate ``data`` against ``model``; errors name the offending fields."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [
            {"loc": ".".join(str(p) for p in err["loc"]) or "(body)", "msg": err["msg"]}
            for err in exc.errors(include_url=False)
        ]
        summary = "; ".join(f"{p['loc']}: {p['msg']}" for p in problems[:5])
        raise ApiError(ErrorCode.BAD_REQUEST, f"invalid {model.__name__}: {summary}", details=problems) from None


async def parse_body(request: Request, model: type[M]) -> M:
    return validate(model, await read_json(request))


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered ``413 payload_too_large`` before it is
    read. A ``Content-Length`` over the limit is refused at once, without calling the app; a body without one
    (chunked) is counted as the app reads it and refused at the first chunk past the limit. Paths under a
    ``streamed`` prefix are left to their route, which streams the body to disk under a limit of its own (the
    collection server's task uploads)."""

    def __init__(self, app: ASGIApp, limit: int, streamed: tuple[str, ...] = ()) -> None:
        self.app, self.limit, self.streamed = app, limit, streamed

    def _refusal(self, size: str) -> ApiError:
        return ApiError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"request body of {size} is over this server's limit of {self.limit} bytes (max_body_bytes)",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.streamed):
            await self.app(scope, receive, send)
            return
        length = next((value for key, value in scope["headers"] if key == b"content-length"), None)
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await ApiError(ErrorCode.BAD_REQUEST, "Content-Length is not a number").response()(scope, receive, send)
                return
            if declared > self.limit:
                await self._refusal(f"{declared} bytes").response()(scope, receive, send)
                return
        if length is not None or not any(key == b"transfer-encoding" for key, _ in scope["headers"]):
            # the server reads no more than the declared length (or no body at all): the app gets uvicorn's own
            # receive and send, which some introspect (the inference worker reads the connection state from them)
            await self.app(scope, receive, send)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise self._refusal(f"more than {self.limit} bytes")
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except ApiError as exc:  # raised where no handler answers it (middleware reading the body)
            if exc.code is not ErrorCode.PAYLOAD_TOO_LARGE or started:
                raise
            await exc.response()(scope, receive, send)
