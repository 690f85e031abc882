"""The client of a Lean sandbox's stateless ``POST /execute`` (see the README).

It sends what NeMo Gym's ``Lean4SandboxClient`` sends (the NeMo Skills sandbox protocol) and reads
each kind of answer as it does:

- the request: ``POST http://<host>:<port>/execute``, ``content-type: application/json``, the body
  ``json.dumps({"generated_code", "language": "lean4", "timeout", "max_output_characters"})`` (ASCII
  escapes, ``", "`` and ``": "`` separators), waiting ``timeout`` + 5 seconds;
- ``502``: ``{process_status: "error", stderr: "Sandbox 502 error"}``;
- any other answer is decoded as JSON, whatever its status, and is the compiler output as it is
  (a JSON error body included); a body that is not JSON: ``{process_status: "error", stderr:
  "Invalid JSON response"}``;
- no answer in time: ``{process_status: "timeout", stderr: "Client timed out"}``; any other transport
  failure: ``{process_status: "error", stderr: <the error's text>}``.

A failure of the sandbox is thus a result (reward 0), never an exception; what ``/verify`` does with
an answer that is JSON but not a compiler output is ``feedback``'s and the app's business.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

LOG = logging.getLogger(__name__)


def _failure(status: str, stderr: str) -> dict[str, Any]:
    return {"process_status": status, "stdout": "", "stderr": stderr}


class LeanSandbox:
    """One pooled HTTP client to ``http://host:port``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_output_characters: int = 1000,
        timeout_margin_s: float = 5.0,
        max_connections: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = f"http://{host}:{port}/execute"
        self.max_output_characters = max_output_characters
        self.timeout_margin_s = timeout_margin_s
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.AsyncClient(limits=limits, transport=transport)

    @staticmethod
    def request_body(code: str, timeout_s: float, max_output_characters: int) -> str:
        return json.dumps(
            {
                "generated_code": code,
                "language": "lean4",
                "timeout": timeout_s,
                "max_output_characters": max_output_characters,
            }
        )

    async def execute(self, code: str, *, timeout_s: float) -> Any:
        """The sandbox's answer: a compiler output ``{process_status, stdout, stderr}`` as it sent it,
        or one describing why there is none."""
        content = self.request_body(code, timeout_s, self.max_output_characters)
        try:
            response = await self._client.post(
                self.url,
                content=content,
                timeout=timeout_s + self.timeout_margin_s,
                headers={"Content-Type": "application/json"},
            )
            if response.status_code == 502:
                LOG.warning("the Lean sandbox answered 502")
                return _failure("error", "Sandbox 502 error")
            return response.json()
        except httpx.TimeoutException:
            LOG.warning("the Lean sandbox did not answer within %.1f seconds", timeout_s + self.timeout_margin_s)
            return _failure("timeout", "Client timed out")
        except httpx.HTTPError as exc:
            LOG.error("the Lean sandbox could not be reached: %s", exc)
            return _failure("error", str(exc))
        except json.JSONDecodeError as exc:
            LOG.error("the Lean sandbox's answer is not JSON: %s", exc)
            return _failure("error", "Invalid JSON response")

    async def aclose(self) -> None:
        await self._client.aclose()
