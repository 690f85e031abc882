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

NeMo Gym requires Python 3.13; our servers run on 3.11. Where an answer carries a message Python itself
writes, the 3.13 text is given (:func:`json_decode_error`, :func:`nan_error`, :func:`call_error_text`): JSON's
"Illegal trailing comma" errors, the offending value in "Out of range float values" and the "Did you mean"
suggestion for an unexpected keyword argument.

:class:`NemoHttpError` carries such an answer; :func:`nemo_error_handler` turns it into a response.
"""

from __future__ import annotations

import email.message
import json
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gym_services.base.http import body_bytes

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
        except UnicodeEncodeError as exc:  # a lone surrogate echoed from the input (a ValueError too: first)
            return repr_error(exc)
        except ValueError:  # a NaN echoed from the input: FastAPI's encoder fails the same way
            return repr_error(nan_error(self.content))


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
    """The body as FastAPI hands it to validation: parsed JSON, raw bytes, or ``None`` when empty (read once: not
    kept on the request, :func:`~gym_services.base.http.body_bytes`)."""
    raw = await body_bytes(request)
    if not raw:
        return None
    content_type = request.headers.get("content-type")
    if not content_type or not _is_json_type(content_type):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise NemoHttpError(422, json_invalid(exc)) from None
    except Exception:
        raise detail_error(400, BODY_PARSE_ERROR) from None


def json_decode_error(exc: json.JSONDecodeError) -> tuple[int, str]:
    """(position, message) of a JSON decode error as Python 3.13 reports it: a comma right before the closing
    bracket is "Illegal trailing comma before end of object/array" at the comma (3.11: "Expecting ..." at the
    bracket); every other error is the same in both."""
    doc, pos = exc.doc, exc.pos
    closing = {"Expecting property name enclosed in double quotes": "}", "Expecting value": "]"}.get(exc.msg)
    if closing and pos < len(doc) and doc[pos] == closing:
        comma = len(doc[:pos].rstrip(" \t\n\r")) - 1
        if comma >= 0 and doc[comma] == ",":
            return comma, "Illegal trailing comma before end of " + ("object" if closing == "}" else "array")
    return pos, exc.msg


def json_invalid(exc: json.JSONDecodeError) -> dict[str, Any]:
    """FastAPI's ``422`` body for malformed JSON."""
    pos, msg = json_decode_error(exc)
    return {
        "detail": [
            {
                "type": "json_invalid",
                "loc": ["body", pos],
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": msg},
            }
        ]
    }


def _first_non_finite(value: Any) -> float | None:
    """The first NaN or infinity :func:`json.dumps` meets in ``value`` (keys, then values, in order)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return item
        if isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                stack += [inner, key]
        elif isinstance(item, (list, tuple)):
            stack += reversed(item)
    return None


def nan_error(content: Any) -> ValueError:
    """The error Python 3.13's JSON encoder raises for a NaN or infinity (3.11 leaves the value out)."""
    bad = _first_non_finite(content)
    suffix = "" if bad is None else f": {bad!r}"
    return ValueError(f"Out of range float values are not JSON compliant{suffix}")


_MOVE, _CASE, _MAX_NAME = 2, 1, 40


def _edit_distance(a: bytes, b: bytes, max_cost: int) -> int:
    """CPython's suggestion distance (moves cost 2, a case change 1; over ``max_cost`` is ``max_cost + 1``)."""
    while a and b and a[0] == b[0]:
        a, b = a[1:], b[1:]
    while a and b and a[-1] == b[-1]:
        a, b = a[:-1], b[:-1]
    if not a or not b:
        return (len(a) + len(b)) * _MOVE
    if len(a) > _MAX_NAME or len(b) > _MAX_NAME:
        return max_cost + 1
    if len(b) < len(a):
        a, b = b, a
    if (len(b) - len(a)) * _MOVE > max_cost:
        return max_cost + 1
    row = [(i + 1) * _MOVE for i in range(len(a))]
    result = 0
    for b_index, code in enumerate(b):
        distance = result = b_index * _MOVE
        minimum = None
        for index, other in enumerate(a):
            cost = 0 if code == other else _CASE if bytes([code]).lower() == bytes([other]).lower() else _MOVE
            substitute = distance + cost
            distance = row[index]
            result = min(min(result, distance) + _MOVE, substitute)
            row[index] = result
            minimum = result if minimum is None else min(minimum, result)
        if minimum is not None and minimum > max_cost:
            return max_cost + 1
    return result


def suggestion(name: str, candidates: list[str]) -> str | None:
    """The name Python 3.13 suggests for ``name`` among ``candidates`` ("Did you mean ...?"), if any."""
    if len(candidates) >= 750:
        return None
    best, best_distance = None, None
    wanted = name.encode("utf-8", "surrogatepass")
    for item in candidates:
        if item == name:
            continue
        encoded = item.encode("utf-8", "surrogatepass")
        max_distance = (len(wanted) + len(encoded) + 3) * _MOVE // 6
        if best_distance is not None:
            max_distance = min(max_distance, best_distance - 1)
        distance = _edit_distance(wanted, encoded, max_distance)
        if distance > max_distance:
            continue
        if best_distance is None or distance < best_distance:
            best, best_distance = item, distance
    return best


_UNEXPECTED = re.compile(r"(?P<qualname>[\w.<>]+)\(\) got an unexpected keyword argument '(?P<name>.*)'", re.S)


def call_error_text(exc: BaseException, fn: Callable[..., Any]) -> str:
    """``str(exc)`` of an error raised by calling ``fn``, as Python 3.13 words it: an unexpected keyword argument
    of ``fn`` itself names the closest parameter ("... Did you mean 'x'?")."""
    text = str(exc)
    if not isinstance(exc, TypeError):
        return text
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    match = _UNEXPECTED.fullmatch(text)
    if code is None or match is None or match["qualname"] != getattr(fn, "__qualname__", None):
        return text
    names = list(code.co_varnames[code.co_posonlyargcount : code.co_argcount + code.co_kwonlyargcount])
    better = suggestion(match["name"], names)
    return text if better is None else f"{text}. Did you mean '{better}'?"


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
    return NemoHttpError(
        422, {"detail": [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]}
    )


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
    except Exception as exc:
        return repr_error(exc)
    return Response(body, status_code=status_code, media_type="application/json", headers=headers)


def repr_error(exc: BaseException) -> JSONResponse:
    """NeMo Gym's answer to an unhandled error in a route: ``500`` with ``repr(error)`` as the JSON body."""
    return JSONResponse(repr(exc), status_code=500)
