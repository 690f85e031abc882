"""The typed HTTP client of the control routes: one method per verb (no kopf, no Kubernetes).

Used by the coordinator (:mod:`gym_services.coordination.coordinator`), the local stack's
discovery (:mod:`gym_services.stack.discovery`) and the operator, through the coordinator.
Every method takes the request model of its verb and returns its response model
(:data:`gym_services.control.models.VERB_MODELS`), the same models the control routes parse
and answer with; an answer that does not validate is a :class:`ParticipantError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from gym_services.control.models import (
    REVEAL_SECRETS,
    VERB_MODELS,
    CaptureRequest,
    CaptureResponse,
    CheckpointRef,
    CommitRequest,
    CommitResponse,
    PhaseResponse,
    PrepareRequest,
    PrepareResponse,
    RestoreRequest,
    RestoreResponse,
    RetireRequest,
    Replica,
    RetireResponse,
    StatusResponse,
)
from gym_services.control.protocol import CONTROL_PREFIX, Role, Verb

__all__ = ["CONTROL_PREFIX", "ControlClient", "ParticipantError", "ParticipantRef"]

M = TypeVar("M", bound=BaseModel)
#: seconds a control call may take unless the caller says otherwise
DEFAULT_CALL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ParticipantRef:
    """One server taking part in checkpoints: who it is and where its control routes are."""

    participant_id: str
    role: Role
    url: str  # base URL, e.g. http://10.0.0.7:8080
    replica: Replica | None = None  # which replica of a replicated server; None: the server has one

    def describe(self) -> str:
        return f"{self.role} {self.participant_id}"


class ParticipantError(Exception):
    """A control call failed: refused with a JSON error, unreachable, or answered something malformed."""

    def __init__(
        self, ref: ParticipantRef, verb: Verb, message: str, *, status: int | None = None, code: str | None = None
    ) -> None:
        super().__init__(f"{verb} on {ref.describe()} failed: {message}")
        self.ref = ref
        self.verb = verb
        self.status = status
        self.code = code
        self.reason = message


class ControlClient:
    """Calls ``{CONTROL_PREFIX}/<verb>`` of participants with the bearer token."""

    def __init__(
        self,
        token: str,
        *,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._headers = {"authorization": f"Bearer {token}"}
        self._timeout_s = timeout_s
        self._client = httpx.AsyncClient(transport=transport, timeout=timeout_s, trust_env=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> ControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- one method per verb -----------------------------------------------------------

    async def status(self, ref: ParticipantRef, *, timeout_s: float | None = None) -> StatusResponse:
        return await self._call(ref, Verb.STATUS, None, timeout_s)

    async def prepare(self, ref: ParticipantRef, req: PrepareRequest, *, timeout_s: float | None = None) -> PrepareResponse:
        return await self._call(ref, Verb.PREPARE, req, timeout_s)

    async def commit(self, ref: ParticipantRef, req: CommitRequest, *, timeout_s: float | None = None) -> CommitResponse:
        return await self._call(ref, Verb.COMMIT, req, timeout_s)

    async def capture(self, ref: ParticipantRef, req: CaptureRequest, *, timeout_s: float | None = None) -> CaptureResponse:
        return await self._call(ref, Verb.CAPTURE, req, timeout_s)

    async def persist(self, ref: ParticipantRef, req: CheckpointRef, *, timeout_s: float | None = None) -> CommitResponse:
        return await self._call(ref, Verb.PERSIST, req, timeout_s)

    async def resume(self, ref: ParticipantRef, req: CheckpointRef, *, timeout_s: float | None = None) -> PhaseResponse:
        return await self._call(ref, Verb.RESUME, req, timeout_s)

    async def abort(self, ref: ParticipantRef, req: CheckpointRef, *, timeout_s: float | None = None) -> PhaseResponse:
        return await self._call(ref, Verb.ABORT, req, timeout_s)

    async def restore(self, ref: ParticipantRef, req: RestoreRequest, *, timeout_s: float | None = None) -> RestoreResponse:
        return await self._call(ref, Verb.RESTORE, req, timeout_s)

    async def retire(self, ref: ParticipantRef, req: RetireRequest, *, timeout_s: float | None = None) -> RetireResponse:
        return await self._call(ref, Verb.RETIRE, req, timeout_s)

    async def lease(self, ref: ParticipantRef, req: CheckpointRef, *, timeout_s: float | None = None) -> PhaseResponse:
        return await self._call(ref, Verb.LEASE, req, timeout_s)

    # --- the wire ---------------------------------------------------------------------

    async def _call(self, ref: ParticipantRef, verb: Verb, req: BaseModel | None, timeout_s: float | None):
        request_model, answer_model = VERB_MODELS[verb]
        if request_model is not None and not isinstance(req, request_model):
            raise TypeError(f"{verb} takes a {request_model.__name__}, got {type(req).__name__}")
        url = f"{ref.url.rstrip('/')}{CONTROL_PREFIX}{verb.path}"
        timeout = timeout_s or self._timeout_s
        try:
            if req is None:
                resp = await self._client.request(verb.method, url, headers=self._headers, timeout=timeout)
            else:
                body = req.model_dump(mode="json", context=REVEAL_SECRETS, exclude_none=True)
                resp = await self._client.request(verb.method, url, json=body, headers=self._headers, timeout=timeout)
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
        try:
            return answer_model.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3])
            raise ParticipantError(ref, verb, f"answered a malformed {answer_model.__name__}: {problems}") from None
