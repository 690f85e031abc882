"""The typed HTTP client of the control routes: one method per verb (no kopf, no Kubernetes).

Used by the participant set (:mod:`gym_services.coordination.participants`), through which both
transactions call, the local stack's discovery (:mod:`gym_services.stack.discovery`) and the operator,
through the coordinator.
Every method takes the request model of its verb and returns its response model
(:data:`gym_services.control.models.VERB_MODELS`), the same models the control routes parse
and answer with; an answer that does not validate is a :class:`ParticipantError`.

The wire is aiohttp: the coordinator's own CPU per call is the one cost of a transaction that
adds up over participants however many machines they run on, and an aiohttp call costs about a
fifth of an httpx one (0.2 ms against 1.0 ms of client CPU, ``benchmarks/scale_out.py`` table 2
shows what it leaves). A caller passing an httpx ``transport`` (tests serving apps in process)
gets httpx instead; both go through :meth:`ControlClient._call`'s one encoding and decoding.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from gym_services.control.models import (
    REVEAL_SECRETS,
    VERB_MODELS,
    CaptureRequest,
    CaptureResponse,
    CheckpointRef,
    PersistResponse,
    PhaseResponse,
    PrepareRequest,
    PrepareResponse,
    Replica,
    RestoreRequest,
    RestoreResponse,
    RetireRequest,
    RetireResponse,
    StatusResponse,
)
from gym_services.control.protocol import CONTROL_PREFIX, LEADER_TERM_HEADER, Role, Verb

if TYPE_CHECKING:  # httpx is imported only with a transport (tests); the CLI starts without it
    import httpx

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
        fence: Callable[[], str | None] | None = None,
    ) -> None:
        """``fence``, called right before every call goes out: the caller's leader term to name on it
        (:data:`~gym_services.control.protocol.LEADER_TERM_HEADER`), None for none; it raises (or ends the process)
        when the caller may no longer send anything."""
        self._headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        self._fence = fence
        self._timeout_s = timeout_s
        self._httpx: httpx.AsyncClient | None = None
        if transport is not None:
            import httpx

            self._httpx = httpx.AsyncClient(transport=transport, timeout=timeout_s, trust_env=False)
        self._session: aiohttp.ClientSession | None = None  # opened on the first call, in the caller's loop

    async def aclose(self) -> None:
        if self._httpx is not None:
            await self._httpx.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> ControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- one method per verb -----------------------------------------------------------

    async def status(
        self, ref: ParticipantRef, *, timeout_s: float | None = None, wait_terminating_s: float | None = None
    ) -> StatusResponse:
        """The participant's status; with ``wait_terminating_s``, answered as soon as it is terminating, or after
        that many seconds (a long-poll: ``docs/protocol.md``, "Termination")."""
        query = f"?wait_terminating_s={wait_terminating_s:g}" if wait_terminating_s is not None else ""
        return await self._call(ref, Verb.STATUS, None, timeout_s, StatusResponse, query)

    async def prepare(
        self, ref: ParticipantRef, req: PrepareRequest, *, timeout_s: float | None = None
    ) -> PrepareResponse:
        return await self._call(ref, Verb.PREPARE, req, timeout_s, PrepareResponse)

    async def capture(
        self, ref: ParticipantRef, req: CaptureRequest, *, timeout_s: float | None = None
    ) -> CaptureResponse:
        return await self._call(ref, Verb.CAPTURE, req, timeout_s, CaptureResponse)

    async def persist(
        self, ref: ParticipantRef, req: CheckpointRef, *, timeout_s: float | None = None
    ) -> PersistResponse:
        return await self._call(ref, Verb.PERSIST, req, timeout_s, PersistResponse)

    async def resume(self, ref: ParticipantRef, req: CheckpointRef, *, timeout_s: float | None = None) -> PhaseResponse:
        return await self._call(ref, Verb.RESUME, req, timeout_s, PhaseResponse)

    async def abort(self, ref: ParticipantRef, req: CheckpointRef, *, timeout_s: float | None = None) -> PhaseResponse:
        return await self._call(ref, Verb.ABORT, req, timeout_s, PhaseResponse)

    async def restore(
        self, ref: ParticipantRef, req: RestoreRequest, *, timeout_s: float | None = None
    ) -> RestoreResponse:
        return await self._call(ref, Verb.RESTORE, req, timeout_s, RestoreResponse)

    async def retire(
        self, ref: ParticipantRef, req: RetireRequest, *, timeout_s: float | None = None
    ) -> RetireResponse:
        return await self._call(ref, Verb.RETIRE, req, timeout_s, RetireResponse)

    async def lease(self, ref: ParticipantRef, req: CheckpointRef, *, timeout_s: float | None = None) -> PhaseResponse:
        return await self._call(ref, Verb.LEASE, req, timeout_s, PhaseResponse)

    # --- the wire ---------------------------------------------------------------------

    async def _send(self, method: str, url: str, body: bytes | None, timeout_s: float) -> tuple[int, bytes]:
        """One request on the wire: its status and body. Connection failures and timeouts raise ``OSError``."""
        headers = self._headers
        term = self._fence() if self._fence is not None else None
        if term is not None:
            headers = {**headers, LEADER_TERM_HEADER: term}
        if self._httpx is not None:
            import httpx

            try:
                resp = await self._httpx.request(method, url, content=body, headers=headers, timeout=timeout_s)
            except httpx.HTTPError as exc:
                raise OSError(f"{type(exc).__name__}: {exc}") from None
            return resp.status_code, resp.content
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), trust_env=False, raise_for_status=False
            )
        try:
            async with self._session.request(
                method, url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as answer:
                return answer.status, await answer.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise OSError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None

    async def _call(
        self,
        ref: ParticipantRef,
        verb: Verb,
        req: BaseModel | None,
        timeout_s: float | None,
        answer_model: type[M],
        query: str = "",
    ) -> M:
        request_model, expected = VERB_MODELS[verb]
        if request_model is not None and not isinstance(req, request_model):
            raise TypeError(f"{verb} takes a {request_model.__name__}, got {type(req).__name__}")
        if answer_model is not expected:
            raise TypeError(f"{verb} answers a {expected.__name__}, not a {answer_model.__name__}")
        url = f"{ref.url.rstrip('/')}{CONTROL_PREFIX}{verb.path}{query}"
        body = None
        if req is not None:
            body = req.model_dump_json(context=REVEAL_SECRETS, exclude_none=True).encode()
        try:
            status, content = await self._send(verb.method, url, body, timeout_s or self._timeout_s)
        except OSError as exc:
            raise ParticipantError(ref, verb, f"unreachable at {ref.url}: {exc}") from None
        try:
            data = json.loads(content)
        except ValueError:
            raise ParticipantError(ref, verb, f"HTTP {status} with a non-JSON body", status=status) from None
        if status != 200:
            error = data.get("error", {}) if isinstance(data, dict) else {}
            raise ParticipantError(
                ref,
                verb,
                f"{error.get('code', 'error')}: {error.get('message', content[:200].decode(errors='replace'))}",
                status=status,
                code=error.get("code"),
            )
        try:
            return answer_model.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:3]
            )
            raise ParticipantError(ref, verb, f"answered a malformed {answer_model.__name__}: {problems}") from None
