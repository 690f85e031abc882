"""Glue: the OpenAPI document and API pages each reference server's FastAPI app serves (``/openapi.json``,
``/docs``, ``/redoc``), from the apps the other glues build."""

from __future__ import annotations

import json
from typing import Any


def _app(server: str) -> Any:
    if server == "workplace_assistant":
        import glue_workplace_assistant as glue

        return glue._server_and_app()[1]
    if server == "indirect_prompt_injection":
        import glue_indirect_prompt_injection as glue

        glue._server()
        return glue._STATE["app"]
    if server == "blackjack":
        import glue_blackjack as glue

        return glue._app_instance()
    if server == "math_formal_lean":
        import glue_math_formal_lean as glue

        return glue._app({})
    raise ValueError(f"unknown server {server!r}")


def pages(server: str) -> dict[str, Any]:
    """``{"openapi": document, "status": {path: status}, "types": {path: content type}}``."""
    from framework import Session

    session = Session(_app(server))
    try:
        answers = {
            path: session.request({"method": "GET", "path": path})
            for path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect")
        }
    finally:
        session.close()
    return {
        "openapi": json.loads(answers["/openapi.json"]["body"]),
        "status": {path: answer["status"] for path, answer in answers.items()},
        "types": {path: answer["content_type"] for path, answer in answers.items()},
    }
