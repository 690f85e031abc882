"""Answering like a NeMo Gym server: its request-body handling and its JSON bodies.

NeMo Gym's servers are FastAPI apps. Agents and models see their answers, so a server of ours that
stands in for one answers the same way on its data routes:

- a body is read as JSON only when its content type is ``application/json`` (or ``...+json``);
  any other body, or none, is validated as raw bytes, so it fails as "not an object";
- malformed JSON is ``422`` with a ``json_invalid`` error at the decoder's position; a body that
  cannot be decoded at all is ``400 {"detail": "There was an error parsing the body"}``;
- an empty body or JSON ``null`` is ``422`` "Field required" at ``["body"]``;
- validation errors are ``422 {"detail": [...]}``: pydantic's errors without their ``url``, each
  ``loc`` prefixed with ``"body"``, bytes inputs shown as text;
- errors raised on purpose are ``{"detail": ...}`` with their status;
- a route's model answer is serialised by pydantic's JSON serialiser (compact, UTF-8, NaN and
  infinities as ``null``), not by :func:`json.dumps`.

:class:`NemoHttpError` carries such an answer; :func:`nemo_error_handler` turns it into a response.
"""

from __future__ import annotations

import email.message
import json
from typing import Any, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

M = TypeVar("M", bound=BaseModel)

BODY_PARSE_ERROR = "There was an error parsing the body"


class NemoHttpError(Exception):
    """An answer in NeMo Gym's form: ``status`` and the JSON ``content`` of the body."""

    def __init__(self, status: int, content: Any) -> None:
        super().__init__(f"{status}: {content!r}")
        self.status = status
        self.content = content

    def response(self) -> Response:
        try:
            return JSONResponse(self.content, status_code=self.status)
        except ValueError as exc:  # a NaN echoed from the input: FastAPI's encoder fails the same way
            return repr_error(exc)


def detail_error(status: int, detail: Any) -> NemoHttpError:
    """An error raised on purpose (FastAPI's ``HTTPException``): ``{"detail": detail}``."""
    return NemoHttpError(status, {"detail": detail})


async def nemo_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, NemoHttpError)
    return exc.response()


def _is_json_type(content_type: str) -> bool:
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


async def read_body(request: Request) -> Any:
    """The body as FastAPI hands it to validation: parsed JSON, raw bytes, or ``None`` when empty."""
    raw = await request.body()
    if not raw:
        return None
    content_type = request.headers.get("content-type")
    if not content_type or not _is_json_type(content_type):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ["body", exc.pos], "msg": "JSON decode error", "input": {}}
        raise NemoHttpError(422, {"detail": [{**error, "ctx": {"error": exc.msg}}]}) from None
    except Exception:  # noqa: BLE001 - undecodable bytes, as FastAPI answers them
        raise detail_error(400, BODY_PARSE_ERROR) from None


def _jsonable(value: Any) -> Any:
    """What FastAPI's encoder makes of a validation error's values (bytes as text, tuples as lists)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    try:
        return _jsonable(vars(value))  # an exception in ``ctx`` has no fields: ``{}``
    except TypeError:
        return str(value)


def validation_error(exc: ValidationError) -> NemoHttpError:
    """``422`` with pydantic's errors located under ``body``."""
    detail = []
    for err in exc.errors(include_url=False):
        item = {**err, "loc": ["body", *err["loc"]]}
        detail.append(_jsonable(item))
    return NemoHttpError(422, {"detail": detail})


def missing_body() -> NemoHttpError:
    return NemoHttpError(422, {"detail": [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]})


def validate_body(model: type[M], body: Any) -> M:
    """Validate a body read by :func:`read_body` against ``model`` as FastAPI does (Python mode)."""
    if body is None:
        raise missing_body()
    try:
        return model.model_validate(body, from_attributes=True)
    except ValidationError as exc:
        raise validation_error(exc) from None


async def parse(request: Request, model: type[M]) -> M:
    return validate_body(model, await read_body(request))


def dump_json(content: Any) -> bytes:
    """A route's answer serialised as pydantic serialises a response model."""
    return pydantic_core.to_json(content, inf_nan_mode="null")


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A model answer; one that cannot be serialised (a lone surrogate) is the framework's ``500``."""
    try:
        body = dump_json(content)
    except Exception as exc:  # noqa: BLE001 - NeMo Gym's exception middleware answers with the repr
        return repr_error(exc)
    return Response(body, status_code=status_code, media_type="application/json", headers=headers)


def repr_error(exc: BaseException) -> JSONResponse:
    """NeMo Gym's answer to an unhandled error in a route: ``500`` with ``repr(error)`` as the JSON body."""
    return JSONResponse(repr(exc), status_code=500)
