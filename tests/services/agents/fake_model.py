"""A small policy model for the agent machinery tests: a real Starlette app on the server base.

It serves ``POST /v1/responses`` (``GATED_NOWAIT``, role ``model``, so the control plane
answers ``409 checkpoint_parked`` while a checkpoint is open) with a deterministic policy
for the counter resources server: the first user message is JSON ``{"calls": [[3, -1], [10]]}``;
generation ``k`` emits the k-th group as ``increment`` function calls, then a final message.
Tests can hold the n-th generation inside the route to put it "in flight".
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.support.asgi import base_config

from gym_services.base.config import ServerConfig, load_config
from gym_services.base.http import read_json
from gym_services.control.admission import RoutePolicy
from gym_services.control.participant import NothingToRestore
from gym_services.server.app import create_server_app


class FakeModelParticipant(NothingToRestore):
    role = "model"
    checkpoint_mode = "stateless"
    checkpoint_verify = "replay"


class FakeModel:
    """State of one fake model instance: what it generated, and the holds tests placed."""

    def __init__(self) -> None:
        self.generated: list[dict[str, Any]] = []  # every request it answered
        self.admitted = 0
        self.holds: dict[int, asyncio.Event] = {}
        self.arrived: dict[int, asyncio.Event] = {}

    def hold(self, index: int) -> tuple[asyncio.Event, asyncio.Event]:
        """Hold the ``index``-th admitted generation; returns (arrived, release)."""
        self.holds[index] = asyncio.Event()
        self.arrived[index] = asyncio.Event()
        return self.arrived[index], self.holds[index]

    @staticmethod
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        items = body.get("input") or []
        first = next(i for i in items if i.get("role") == "user")
        groups = json.loads(first["content"])["calls"]
        done = sum(1 for i in items if i.get("type") == "function_call_output")
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
        sizes = [len(g) for g in groups]
        k, seen = 0, 0
        while k < len(groups) and seen + sizes[k] <= done:
            seen += sizes[k]
            k += 1
        if k < len(groups) and seen == done:
            output = [
                {
                    "type": "function_call",
                    "id": f"fc_{digest}_{j}",
                    "call_id": f"call_{k}_{j}",
                    "name": "increment",
                    "arguments": json.dumps({"by": by}),
                    "status": "completed",
                }
                for j, by in enumerate(groups[k])
            ]
        else:
            output = [
                {
                    "type": "message",
                    "id": f"msg_{digest}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": f"done after {done} calls", "annotations": []}],
                }
            ]
        return {
            "id": f"resp_{digest}",
            "object": "response",
            "model": body.get("model"),
            "output": output,
            "usage": {"input_tokens": len(items), "output_tokens": 7, "total_tokens": len(items) + 7},
            "incomplete_details": None,
        }


def create_fake_model(name: str = "model") -> tuple[Starlette, FakeModel]:
    state = FakeModel()

    async def responses(request: Request) -> JSONResponse:
        body = await read_json(request)
        index = state.admitted
        state.admitted += 1
        if index in state.holds:
            state.arrived[index].set()
            await state.holds[index].wait()
        state.generated.append(body)
        return JSONResponse(state.answer(body))

    config = load_config(ServerConfig, overrides=base_config(name))
    app = create_server_app(
        config,
        FakeModelParticipant(),
        [Route("/v1/responses", responses, methods=["POST"])],
        policies={"/v1/responses": RoutePolicy.GATED_NOWAIT},
    )
    app.state.fake = state
    return app, state
