"""Admission: which data requests may run while a checkpoint is open (``docs/protocol.md``, "Admission").

:class:`Admission` is the state: open or closed (set by the control plane,
:mod:`gym_services.control.plane`, at every phase change), the data requests in flight, and the
attempt fence. :class:`AdmissionMiddleware` applies it; the app factory
(:func:`gym_services.server.app.create_server_app`) puts it on the ``Mount`` of the data routes
only, so control, health and metrics routes never pass through it and never queue behind data
requests. A participant that parks its own work at boundaries (the agent) reads the same object.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import Counter
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.base.sessions import session_identity
from gym_services.control.fencing import AttemptFence
from gym_services.control.models import Blocker
from gym_services.control.protocol import Phase


class RoutePolicy(enum.Enum):
    """How a data route behaves while a checkpoint is open."""

    GATED = "gated"  # refused (409 checkpoint_parked); in-flight ones finish before prepare answers
    GATED_NOWAIT = "gated_nowait"  # refused; in-flight ones are the participant's business (cut, held)
    OPEN = "open"  # always served (agent /run parks itself; stateless replay /verify)


PolicyResolver = Callable[[str, str], RoutePolicy]

#: the bounds of a parked call's ``Retry-After`` (seconds): no sooner (a client told to come back at once would
#: poll the server through the pause) and no later (an estimate from an unusually long pause)
RETRY_AFTER_MIN_S = 0.02
RETRY_AFTER_MAX_S = 0.25
#: the pause assumed before this server has seen one end
FIRST_PAUSE_GUESS_S = 0.1


def policy_table(policies: Mapping[str, RoutePolicy], default: RoutePolicy = RoutePolicy.GATED) -> PolicyResolver:
    """Resolve by exact path, then by the longest matching ``prefix*`` entry, else ``default``."""
    prefixes = sorted(((k[:-1], v) for k, v in policies.items() if k.endswith("*")), key=lambda kv: -len(kv[0]))

    def resolve(method: str, path: str) -> RoutePolicy:
        if path in policies:
            return policies[path]
        for prefix, policy in prefixes:
            if path.startswith(prefix):
                return policy
        return default

    return resolve


@dataclass
class InFlightRequest:
    method: str
    path: str
    policy: RoutePolicy
    started: float
    identity: RolloutIdentity | None


class Admission:
    """Open or closed, the data requests in flight, and the fence of stale attempts."""

    def __init__(self, participant_id: str) -> None:
        self.participant_id = participant_id
        self.is_open = True
        self.inflight: dict[int, InFlightRequest] = {}
        self.fence = AttemptFence()
        self._closed_for: tuple[str | None, Phase] | None = None
        self._ids = itertools.count()
        #: when the current checkpoint's pause began (admission closed by a prepare), and how long the last one was
        self._paused_at: float | None = None
        self._last_pause_s = FIRST_PAUSE_GUESS_S

    def set(self, is_open: bool, checkpoint_id: str | None, phase: Phase) -> None:
        """Open or close admission (the control plane, at each phase change)."""
        now = time.monotonic()
        if not is_open and self.is_open and phase is Phase.PREPARING:
            self._paused_at = now
        elif is_open and self._paused_at is not None:
            self._last_pause_s = now - self._paused_at
            self._paused_at = None
        elif not is_open and phase is Phase.RESTORING:
            self._paused_at = None  # a restore is no checkpoint pause: its length says nothing about the next one
        self.is_open = is_open
        self._closed_for = None if is_open else (checkpoint_id, phase)

    def retry_after(self) -> float:
        """When a parked call should come back (seconds): half the time left until this pause has lasted as long as
        the last one did, within :data:`RETRY_AFTER_MIN_S` .. :data:`RETRY_AFTER_MAX_S`. A fixed step made a call
        that met the pause's start wait the whole pause and up to a step more (100 ms of a 387 ms worst call,
        ``tests/services/control/test_admission_retry_after.py``); the whole time left made it wait as long as the
        last pause, which overshoots a shorter one (a server's first pause is its longest: 191 ms, then 122 ms at
        10,000 sessions). Halving keeps the overshoot within half the estimate's error, for a few more retries (at
        most about log2(250 / 20) before the floor)."""
        if self._paused_at is None:
            return RETRY_AFTER_MIN_S
        left = self._last_pause_s - (time.monotonic() - self._paused_at)
        return min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, left / 2))

    def parked(self) -> ApiError:
        """The refusal of a gated data request while admission is closed."""
        checkpoint_id, phase = self._closed_for or (None, Phase.OPEN)
        return ApiError(
            ErrorCode.CHECKPOINT_PARKED,
            f"checkpoint {checkpoint_id} is open on {self.participant_id}; retry after resume",
            details={"checkpoint_id": checkpoint_id, "phase": phase},
        )

    def blocking(self) -> list[Blocker]:
        """In-flight GATED requests: prepare waits for them."""
        now = time.monotonic()
        return [
            Blocker(
                kind="request",
                id=f"{r.method} {r.path}",
                detail=(f"rollout {r.identity.rollout_id} attempt {r.identity.attempt}, " if r.identity else "")
                + f"running {now - r.started:.2f}s",
            )
            for r in self.inflight.values()
            if r.policy is RoutePolicy.GATED
        ]

    def track(self, method: str, path: str, policy: RoutePolicy, identity: RolloutIdentity | None) -> int:
        request_id = next(self._ids)
        self.inflight[request_id] = InFlightRequest(method, path, policy, time.monotonic(), identity)
        return request_id


def call_identity(headers: RolloutIdentity | None, session: RolloutIdentity | None) -> RolloutIdentity | None:
    """The identity a data call is fenced by: its identity headers, else the one its session cookie was signed with.

    A call without headers on a cookie signed for attempt 0 is attempt 0, whatever happened since: after a restore
    moved the rollout on, it is stale. A restored attempt sends the cookie its boundary kept with its own, newer,
    headers: it is that newer attempt (and its answer carries the cookie signed again for it, ``base/sessions.py``).
    Headers naming another rollout than the session's, or an attempt older than the cookie's, are refused and change
    nothing.
    """
    if session is None:
        return headers
    if headers is None:
        return session
    if headers.rollout_id != session.rollout_id:
        raise ApiError(
            ErrorCode.BAD_REQUEST,
            f"the session belongs to rollout {session.rollout_id!r}; this call names rollout {headers.rollout_id!r}",
            details={"session_rollout_id": session.rollout_id, "rollout_id": headers.rollout_id},
        )
    if headers.attempt < session.attempt:
        raise ApiError(
            ErrorCode.STALE_ATTEMPT,
            f"rollout {headers.rollout_id!r} attempt {headers.attempt} is stale: its session's cookie is attempt "
            f"{session.attempt}",
            details={"rollout_id": headers.rollout_id, "attempt": headers.attempt, "current": session.attempt},
        )
    return headers


class AdmissionMiddleware:
    """Fences stale attempts and refuses gated data requests while admission is closed.

    A call is fenced by its identity headers; on a server whose state is keyed by the session cookie
    (``sessions``), by :func:`call_identity` of its headers and its session's signed identity.
    """

    def __init__(
        self, app: ASGIApp, admission: Admission, resolve: PolicyResolver, refused: Counter, sessions: bool = False
    ) -> None:
        self.app = app
        self.admission = admission
        self.resolve = resolve
        self.refused = refused
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        admission = self.admission
        policy = self.resolve(scope["method"], scope["path"])
        try:
            identity = RolloutIdentity.from_headers(_headers(scope))
            if self.sessions:
                identity = call_identity(identity, session_identity(scope))
            if identity is not None:
                admission.fence.check(identity)
            if not admission.is_open and policy is not RoutePolicy.OPEN:
                raise admission.parked()
            if identity is not None:
                admission.fence.observe(identity)
        except ApiError as exc:
            self.refused.labels(code=exc.code).inc()
            parked = exc.code is ErrorCode.CHECKPOINT_PARKED
            retry = {"retry-after": f"{admission.retry_after():.3f}"} if parked else None
            await exc.response(headers=retry)(scope, receive, send)
            return
        request_id = admission.track(scope["method"], scope["path"], policy, identity)
        try:
            await self.app(scope, receive, send)
        finally:
            del admission.inflight[request_id]


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
