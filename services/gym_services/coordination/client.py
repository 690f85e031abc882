"""HTTP client for the control routes of participants (no kopf, no Kubernetes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from gym_services.control.models import Role

CONTROL_PREFIX = "/ng-control/v1/checkpoint"


@dataclass(frozen=True)
class ParticipantRef:
    """One server taking part in checkpoints: who it is and where its control routes are."""

    participant_id: str
    role: Role
    url: str  # base URL, e.g. http://10.0.0.7:8080

    def describe(self) -> str:
        return f"{self.role} {self.participant_id}"


class ParticipantError(Exception):
    """A control call failed: refused with a JSON error, or the server was unreachable."""

    def __init__(self, ref: ParticipantRef, verb: str, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(f"{verb} on {ref.describe()} failed: {message}")
        self.ref = ref
        self.verb = verb
        self.status = status
        self.code = code
        self.reason = message


class ControlClient:
    """Calls ``/ng-control/v1/checkpoint/<verb>`` with the bearer token."""

    def __init__(self, token: str, *, timeout_s: float = 30.0, transport: httpx.AsyncBaseTransport | None = None):
        self._headers = {"authorization": f"Bearer {token}"}
        self._timeout_s = timeout_s
        self._client = httpx.AsyncClient(transport=transport, timeout=timeout_s, trust_env=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> ControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def call(
        self, ref: ParticipantRef, verb: str, body: dict[str, Any] | None = None, *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        url = f"{ref.url.rstrip('/')}{CONTROL_PREFIX}/{verb}"
        timeout = timeout_s or self._timeout_s
        try:
            if verb == "status":
                resp = await self._client.get(url, headers=self._headers, timeout=timeout)
            else:
                resp = await self._client.post(url, json=body or {}, headers=self._headers, timeout=timeout)
        except httpx.HTTPError as exc:
            raise ParticipantError(ref, verb, f"unreachable at {ref.url}: {type(exc).__name__}: {exc}") from None
        try:
            data = resp.json()
        except ValueError:
            raise ParticipantError(ref, verb, f"HTTP {resp.status_code} with a non-JSON body", status=resp.status_code) from None
        if resp.status_code != 200:
            error = data.get("error", {}) if isinstance(data, dict) else {}
            raise ParticipantError(
                ref,
                verb,
                f"{error.get('code', 'error')}: {error.get('message', resp.text[:200])}",
                status=resp.status_code,
                code=error.get("code"),
            )
        return data
