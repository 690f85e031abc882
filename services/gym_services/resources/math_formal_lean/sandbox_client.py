"""The client of a Lean sandbox's stateless ``POST /execute`` (REFERENCE B.3).

Every failure of the sandbox itself (unreachable, a non-200 answer, a reply that is not
the expected JSON, no answer in time) comes back as a compiler output with its own
``process_status``, so ``/verify`` turns it into a reward-0 result instead of a 500.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

SANDBOX_ERROR = "sandbox_error"


class ExecuteRequest(BaseModel):
    generated_code: str
    language: str = "lean4"
    timeout: float
    max_output_characters: int


class ExecuteReply(BaseModel):
    process_status: str
    stdout: str = ""
    stderr: str = ""


class LeanSandbox:
    """One pooled HTTP client to ``http://host:port``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_margin_s: float = 5.0,
        max_connections: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = f"http://{host}:{port}"
        self.timeout_margin_s = timeout_margin_s
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.AsyncClient(base_url=self.base_url, limits=limits, transport=transport)

    async def execute(self, code: str, *, timeout_s: float, max_output_characters: int) -> dict[str, Any]:
        """The sandbox's ``{process_status, stdout, stderr}``, or one describing why there is none."""
        request = ExecuteRequest(generated_code=code, timeout=timeout_s, max_output_characters=max_output_characters)
        client_timeout = timeout_s + self.timeout_margin_s
        try:
            response = await self._client.post("/execute", json=request.model_dump(), timeout=client_timeout)
        except httpx.TimeoutException:
            return _reply("timeout", f"Sandbox did not answer within {client_timeout:g} seconds")
        except httpx.HTTPError as exc:
            return _reply(SANDBOX_ERROR, f"Sandbox at {self.base_url} is unreachable: {type(exc).__name__}")
        if response.status_code != 200:
            return _reply(SANDBOX_ERROR, f"Sandbox {response.status_code} error")
        try:
            return ExecuteReply.model_validate_json(response.content).model_dump()
        except ValidationError as exc:
            problem = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in problem["loc"]) or "(body)"
            return _reply(SANDBOX_ERROR, f"Sandbox returned an invalid reply: {where}: {problem['msg']}")

    async def aclose(self) -> None:
        await self._client.aclose()


def _reply(status: str, stderr: str) -> dict[str, Any]:
    return ExecuteReply(process_status=status, stdout="", stderr=stderr).model_dump()
