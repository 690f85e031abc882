"""A server's API description: an OpenAPI 3.1 document generated from the pydantic models of its routes, and the
pages that show it.

A server that stands in for a NeMo Gym server lists its data routes as :class:`Operation` values (method, path,
request and answer types); :func:`openapi_routes` serves

- ``GET /openapi.json``: the OpenAPI 3.1 document (``components.schemas`` from the models' JSON Schemas, as
  pydantic writes them: the request in validation mode, the answer in serialisation mode);
- ``GET /docs``: Swagger UI rendering it, its script and style served from the ``swagger-ui-py`` package
  (``/docs/static/...``), so the page works without reaching the internet;
- ``GET /docs/oauth2-redirect``: the page Swagger UI's OAuth2 sign-in returns to, as ``swagger-ui-py`` ships it
  (NeMo Gym's FastAPI app serves its own copy of the same page at this path: the status and the page's purpose are
  the same, its bytes are Swagger UI's own);
- ``GET /redoc``: the same document through the page's other layout is not offered: no package on PyPI ships
  ReDoc's script without a web framework of its own (``fastapi-offline``), so ``/redoc`` answers a page that
  links to ``/docs`` and ``/openapi.json``.

These routes are public like NeMo Gym's (no session, no admission): they describe, they change nothing.
"""

from __future__ import annotations

import html
import importlib.metadata
import mimetypes
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

REF = "#/components/schemas/{model}"
#: FastAPI's validation error answer, which every NeMo Gym data route may give
_VALIDATION_ERROR = {
    "ValidationError": {
        "title": "ValidationError",
        "type": "object",
        "required": ["loc", "msg", "type"],
        "properties": {
            "loc": {
                "title": "Location",
                "type": "array",
                "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            },
            "msg": {"title": "Message", "type": "string"},
            "type": {"title": "Error Type", "type": "string"},
            "input": {"title": "Input"},
            "ctx": {"title": "Context", "type": "object"},
        },
    },
    "HTTPValidationError": {
        "title": "HTTPValidationError",
        "type": "object",
        "properties": {
            "detail": {"title": "Detail", "type": "array", "items": {"$ref": REF.format(model="ValidationError")}}
        },
    },
}


@dataclass(frozen=True)
class Operation:
    """One route as the document lists it. ``request``/``response``: a pydantic model or any type pydantic can
    describe (``dict[str, Any]``); ``None``: no body. ``status`` other than 200 documents a route that answers
    with another status (``description`` says why)."""

    method: str
    path: str
    summary: str
    request: Any = None
    response: Any = None
    description: str = ""
    status: int = 200
    validates: bool = True
    extra_responses: dict[int, str] = field(default_factory=dict)


class _Schemas:
    def __init__(self) -> None:
        self.components: dict[str, Any] = {}

    def ref(self, kind: Any, mode: JsonSchemaMode) -> dict[str, Any]:
        schema = TypeAdapter(kind).json_schema(mode=mode, ref_template=REF)
        for name, definition in schema.pop("$defs", {}).items():
            self._add(name, definition)
        title = schema.get("title")
        if isinstance(kind, type) and title and schema.get("type") == "object" and "properties" in schema:
            self._add(title, schema)
            return {"$ref": REF.format(model=title)}
        return schema

    def _add(self, name: str, definition: Any) -> None:
        known = self.components.setdefault(name, definition)
        if known != definition:  # two models of one name: the document could not tell them apart
            raise ValueError(f"two different schemas named {name!r} in one OpenAPI document")


def _operation_id(op: Operation) -> str:
    words = "".join(c if c.isalnum() else "_" for c in op.path.strip("/")) or "root"
    return f"{words}_{op.method.lower()}"


def openapi_document(title: str, operations: list[Operation], description: str = "") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations``."""
    schemas = _Schemas()
    paths: dict[str, dict[str, Any]] = {}
    validation = False
    for op in operations:
        entry: dict[str, Any] = {"summary": op.summary, "operationId": _operation_id(op)}
        if op.description:
            entry["description"] = op.description
        params = [part[1:-1] for part in op.path.split("/") if part.startswith("{") and part.endswith("}")]
        if params:
            entry["parameters"] = [
                {
                    "name": name,
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "title": name.replace("_", " ").title()},
                }
                for name in params
            ]
        if op.request is not None:
            entry["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schemas.ref(op.request, "validation")}},
            }
        answer: dict[str, Any] = {"description": "Successful Response" if op.status == 200 else op.description}
        if op.response is not None:
            answer["content"] = {"application/json": {"schema": schemas.ref(op.response, "serialization")}}
        responses: dict[str, Any] = {str(op.status): answer}
        if op.request is not None and op.validates:
            validation = True
            responses["422"] = {
                "description": "Validation Error",
                "content": {"application/json": {"schema": {"$ref": REF.format(model="HTTPValidationError")}}},
            }
        for status, text in op.extra_responses.items():
            responses[str(status)] = {"description": text}
        entry["responses"] = responses
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    if validation:
        for name, definition in _VALIDATION_ERROR.items():
            schemas.components.setdefault(name, definition)
    try:
        version = importlib.metadata.version("gym-checkpoint")
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    info: dict[str, Any] = {"title": title, "version": version}
    if description:
        info["description"] = description
    return {
        "openapi": "3.1.0",
        "info": info,
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.components.items()))},
    }


@lru_cache(maxsize=1)
def _swagger_static() -> Path:
    """Swagger UI's files, as the ``swagger-ui-py`` package ships them."""
    import importlib.util

    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the swagger-ui-py package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


_DOCS_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<link rel="stylesheet" href="/docs/static/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="/docs/static/swagger-ui-bundle.js"></script>
<script src="/docs/static/docs-init.js"></script>
</body></html>
"""
_DOCS_INIT = (
    "window.ui = SwaggerUIBundle({url: '/openapi.json', dom_id: '#swagger-ui', deepLinking: true, "
    "oauth2RedirectUrl: window.location.origin + '/docs/oauth2-redirect'});\n"
)
_REDOC_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>
<body><h1>{title}</h1><p>This server's API: <a href="/docs">/docs</a> (Swagger UI) and
<a href="/openapi.json">/openapi.json</a> (OpenAPI 3.1).</p></body></html>
"""


def openapi_routes(title: str, operations: list[Operation], description: str = "") -> list[BaseRoute]:
    """``/openapi.json``, ``/docs`` (its static files and its OAuth2 redirect page) and ``/redoc`` for these
    operations."""
    document = openapi_document(title, operations, description)
    page_title = html.escape(f"{title} - API")

    async def spec(request: Request) -> Response:
        return JSONResponse(document)

    async def docs(request: Request) -> Response:
        return HTMLResponse(_DOCS_PAGE.format(title=page_title))

    async def redoc(request: Request) -> Response:
        return HTMLResponse(_REDOC_PAGE.format(title=page_title))

    async def oauth2_redirect(request: Request) -> Response:
        return HTMLResponse((_swagger_static() / "oauth2-redirect.html").read_text())

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "docs-init.js":
            return Response(_DOCS_INIT, media_type="text/javascript")
        root = _swagger_static()
        path = (root / name).resolve()
        if (
            name not in {"swagger-ui.css", "swagger-ui-bundle.js"}
            or not path.is_file()
            or path.parent != root.resolve()
        ):
            raise HTTPException(404, "Not Found")
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        return Response(path.read_bytes(), media_type=kind, headers={"cache-control": "public, max-age=86400"})

    return [
        Route("/openapi.json", spec, methods=["GET"]),
        Route("/docs", docs, methods=["GET"]),
        Route("/docs/oauth2-redirect", oauth2_redirect, methods=["GET"]),
        Route("/docs/static/{name}", static, methods=["GET"]),
        Route("/redoc", redoc, methods=["GET"]),
    ]
