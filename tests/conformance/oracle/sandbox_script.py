"""A Lean sandbox that answers from a script and records what it receives (an httpx transport).

Imported on both sides of the math_formal_lean comparison (by ``glue_math_formal_lean.py`` inside the
oracle environment and by ``test_lean_conformance.py`` for our server), so both servers' sandbox
clients get byte-identical answers and exceptions. Needs only httpx.

A scripted answer is ``{"status", "json"}`` (a JSON reply), ``{"status", "raw", "content_type"?}``
(any other body) or ``{"raise": "timeout" | "connect"}`` (the HTTP call fails).
"""

from __future__ import annotations

import json
from typing import Any

import httpx


class ScriptedSandbox:
    def __init__(self) -> None:
        self.script: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.overdrawn = 0
        self.transport = httpx.MockTransport(self._handle)

    def load(self, answers: list[dict[str, Any]]) -> None:
        self.script = list(answers)
        self.received = []
        self.overdrawn = 0

    def take_received(self) -> list[dict[str, Any]]:
        received, self.received = self.received, []
        return received

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.received.append(
            {
                "method": request.method,
                "url": str(request.url),
                "content_type": request.headers.get("content-type"),
                "timeout": request.extensions.get("timeout"),
                "body": request.content.decode(),
            }
        )
        if not self.script:
            self.overdrawn += 1
            return httpx.Response(599, text="sandbox script exhausted")
        answer = self.script.pop(0)
        if answer.get("raise") == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        if answer.get("raise") == "connect":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if "json" in answer:
            content = json.dumps(answer["json"]).encode()
            return httpx.Response(
                answer.get("status", 200), content=content, headers={"content-type": "application/json"}
            )
        headers = {"content-type": answer.get("content_type", "text/plain")}
        return httpx.Response(answer.get("status", 200), content=answer.get("raw", "").encode(), headers=headers)
