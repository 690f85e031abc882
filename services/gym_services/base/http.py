"""Request-body parsing that turns every malformed input into a 400, never a 500.

Used by the control routes and by the data routes of servers that answer in our own error form.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from gym_services.base.errors import ApiError, ErrorCode

M = TypeVar("M", bound=BaseModel)


async def read_json(request: Request) -> Any:
    """The request body as JSON; an empty body is ``{}``."""
    raw = await request.body()
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
