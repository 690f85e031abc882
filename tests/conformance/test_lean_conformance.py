"""math_formal_lean answers like NeMo Gym 0.7.0's: same calls and sandbox answers to both, bytes compared."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
from starlette.applications import Starlette

from gym_services.base.config import ConfigError, load_config
from gym_services.resources.math_formal_lean.app import Config, create_app
from tests.conformance.http_cases import request_kwargs
from tests.conformance.oracle.sandbox_script import ScriptedSandbox
from tests.support.asgi import base_config


@contextlib.asynccontextmanager
async def our_lean(sandbox: ScriptedSandbox, **overrides: Any) -> AsyncIterator[Starlette]:
    fields = {"sandbox_host": "127.0.0.1", "sandbox_port": 6000, **overrides}
    app = create_app(load_config(Config, overrides=base_config("math_formal_lean", **fields)), sandbox_transport=sandbox.transport)
    async with app.router.lifespan_context(app):
        yield app


async def run_ours(sequences: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our side of ``oracle/glue_math_formal_lean.run_sequences``: one app per config, a fresh session per sequence."""
    sandbox = ScriptedSandbox()
    results = []
    async with contextlib.AsyncExitStack() as stack:
        apps: dict[str, Starlette] = {}
        for sequence in sequences:
            config = sequence.get("config") or {}
            key = json.dumps(config, sort_keys=True)
            if key not in apps:
                try:
                    apps[key] = await stack.enter_async_context(our_lean(sandbox, **config))
                except ConfigError as exc:  # a config the reference accepts and ours refuses
                    results.append({"answers": [{"status": 0, "body": str(exc), "sandbox": []} for _ in sequence["calls"]]})
                    continue
            sandbox.load(sequence.get("sandbox", []))
            transport = httpx.ASGITransport(app=apps[key], raise_app_exceptions=False)
            answers = []
            async with httpx.AsyncClient(transport=transport, base_url="http://ours", timeout=60) as client:
                for call in sequence["calls"]:
                    reply = await client.request(call.get("method", "POST"), call["path"], **request_kwargs(call))
                    answers.append({"status": reply.status_code, "body": reply.text, "sandbox": sandbox.take_received()})
            results.append({"answers": answers, "unused_answers": len(sandbox.script), "overdrawn": sandbox.overdrawn})
    return results


def lean_allowed(call: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    return None
