"""Every server answers malformed input on every POST route with a 4xx JSON error, never a 500."""

from __future__ import annotations

import pytest
from starlette.routing import Mount, Route
from tests.support.asgi import SECRET, TOKEN, serve

from gym_services.server.registry import SERVERS
from gym_services.server.serve import build_app

#: fields a server's config requires (downstream URLs point nowhere: bad input must be refused first)
REQUIRED = {
    "simple_agent": {"model_url": "http://127.0.0.1:9", "model": "m", "resources_url": "http://127.0.0.1:9"},
    "proof_refinement_agent": {"model_url": "http://127.0.0.1:9", "model": "m", "resources_url": "http://127.0.0.1:9"},
    "gymnasium_agent": {"model_url": "http://127.0.0.1:9", "model": "m", "env_url": "http://127.0.0.1:9"},
}
BAD_BODIES = [b"{not json", b"[1, 2, 3]", b'"just a string"']
#: servers whose data routes answer bad bodies as NeMo Gym's FastAPI does (``422 {"detail": [...]}``,
#: checked byte for byte by tests/conformance); their control routes keep our error shape
NEMO_GYM_ANSWERS = {"blackjack", "indirect_prompt_injection", "math_formal_lean", "workplace_assistant"}


def post_routes(app) -> list[str]:
    paths = []
    for route in app.routes:
        if isinstance(route, Route) and "POST" in (route.methods or ()):
            paths.append(route.path.replace("{tool_name}", "email_search_emails").replace("{rollout_id}", "r1"))
        if isinstance(route, Mount) and route.path.endswith("/checkpoint"):
            paths += [f"{route.path}/{r.path.lstrip('/')}" for r in route.routes if "POST" in (r.methods or ())]
    return paths


@pytest.mark.parametrize("server", sorted(SERVERS))
async def test_malformed_bodies_get_4xx_json(server: str) -> None:
    overrides = {"session_secret": SECRET, "checkpoint": {"control_token": TOKEN}, **REQUIRED.get(server, {})}
    app, _config = build_app(server, overrides=overrides)
    routes = post_routes(app)
    assert routes, f"{server} has no POST routes"
    async with serve(app) as client:
        for path in routes:
            for body in BAD_BODIES:
                headers = {
                    "authorization": f"Bearer {TOKEN}",
                    "content-type": "application/json",
                    "x-ng-rollout-id": "r1",
                    "x-ng-attempt": "0",
                }
                resp = await client.post(path, content=body, headers=headers)
                assert 400 <= resp.status_code < 500, (server, path, body, resp.status_code, resp.text[:300])
                if server in NEMO_GYM_ANSWERS and not path.startswith("/ng-control/"):
                    detail = resp.json()["detail"]
                    assert resp.status_code == 422 and detail and all(d["type"] and d["msg"] for d in detail), (
                        server,
                        path,
                        resp.text[:300],
                    )
                    continue
                error = (
                    resp.json().get("error")
                    if resp.headers.get("content-type", "").startswith("application/json")
                    else None
                )
                assert isinstance(error, dict) and error.get("code") and error.get("message"), (
                    server,
                    path,
                    resp.text[:300],
                )
