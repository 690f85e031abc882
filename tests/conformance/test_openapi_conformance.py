"""The API document every server serves (/openapi.json, /docs, /redoc) against NeMo Gym's FastAPI apps: every route
the reference lists is listed, with the same request and answer fields, and the document is valid OpenAPI 3.1.

Compared per operation (path templates up to their parameter's name: the reference's ``/{path}`` is our
``/{tool_name}``): the method, whether it takes a body, and the request's and the 200 answer's top-level fields
(properties and required ones) after resolving ``$ref``. Not compared: schema names and the nested schemas of the
OpenAI types (NeMo Gym's are the SDK's, ours our own models of the same wire form, compared answer by answer by the
server suites); ``/aggregate_metrics`` is listed as ours answers it (404, the known gap in README.md).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate

from tests.conformance.oracle.client import Oracle
from tests.support.asgi import base_config

SERVERS = ["workplace_assistant", "indirect_prompt_injection", "blackjack", "math_formal_lean"]
#: the pages every server serves besides its routes
PAGES = ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect")


def _template(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def _resolve(doc: dict[str, Any], schema: dict[str, Any] | None) -> dict[str, Any] | None:
    if schema is None:
        return None
    if "$ref" in schema:
        return _resolve(doc, doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]])
    if "anyOf" in schema:  # a union of models: the union of their fields, required where every member requires it
        members = [_resolve(doc, s) or {} for s in schema["anyOf"]]
        props = {k for m in members for k in m.get("properties", {})}
        required = set.intersection(*(set(m.get("required", [])) for m in members)) if members else set()
        return {"properties": dict.fromkeys(props), "required": sorted(required)}
    return schema


def _fields(doc: dict[str, Any], schema: dict[str, Any] | None) -> tuple[list[str], list[str]] | None:
    resolved = _resolve(doc, schema)
    if resolved is None:
        return None
    return sorted(resolved.get("properties", {})), sorted(resolved.get("required", []))


def operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            ok = op["responses"].get("200", {}).get("content", {}).get("application/json", {}).get("schema")
            out[(method, _template(path))] = {
                "request": _fields(doc, body),
                "response": _fields(doc, ok),
                "statuses": sorted(op["responses"]),
            }
    return out


async def _ours(server: str) -> dict[str, Any]:
    module = importlib.import_module(f"gym_services.resources.{server}.app")
    app = module.create_app(module.Config.model_validate(base_config(server)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ours") as client:
        answers = {path: await client.get(path) for path in PAGES}
        docs = answers["/docs"].text
        assets = [await client.get(src) for src in re.findall(r'(?:src|href)="(/docs/static/[^"]+)"', docs)]
    assert all(a.status_code == 200 for a in assets) and len(assets) == 3, "the page's script and style are served"
    assert "cdn" not in docs.lower() and "http" not in docs, "no asset from the internet"
    return {
        "openapi": answers["/openapi.json"].json(),
        "status": {p: a.status_code for p, a in answers.items()},
        "types": {p: a.headers.get("content-type") for p, a in answers.items()},
    }


@pytest.mark.parametrize("server", SERVERS)
async def test_api_document_lists_every_route_of_the_reference(oracle: Oracle, server: str) -> None:
    ref = oracle.call("openapi", "pages", server)
    ours = await _ours(server)
    assert ours["status"] == ref["status"] == dict.fromkeys(PAGES, 200)
    # the page Swagger UI's OAuth2 sign-in returns to: an HTML page in both (ours is swagger-ui-py's own copy)
    assert ours["types"]["/docs/oauth2-redirect"] == ref["types"]["/docs/oauth2-redirect"] == "text/html; charset=utf-8"
    validate(ours["openapi"])  # OpenAPI 3.1, every $ref resolvable
    assert ours["openapi"]["openapi"].startswith("3.1")
    ref_ops, our_ops = operations(ref["openapi"]), operations(ours["openapi"])
    assert sorted(ref_ops) == sorted(our_ops)
    differing = {}
    for key, want in ref_ops.items():
        got = our_ops[key]
        if key == ("post", "/aggregate_metrics"):  # the known gap: listed, answered 404
            assert got["statuses"] == ["404"] and got["request"] is None
            continue
        if want["request"] != got["request"]:
            differing[f"{key} request"] = {"reference": want["request"], "ours": got["request"]}
        # an answer lists at least the reference's fields (its required ones differ by how each side's pydantic
        # writes defaults in serialisation mode; NeMo Gym's tool answer models declare no field)
        if (want["response"] is None) != (got["response"] is None) or (
            want["response"] and not set(want["response"][0]) <= set(got["response"][0])
        ):
            differing[f"{key} response"] = {"reference": want["response"], "ours": got["response"]}
    assert differing == {}
