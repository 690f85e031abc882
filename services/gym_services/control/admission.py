"""Admission: which data requests may run while a checkpoint is open (DESIGN §5).

A pure ASGI middleware in front of the data routes. Control, health and metrics
routes never pass through it, so they never queue behind data requests.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.control.models import Blocker
from gym_services.control.protocol import CONTROL_PREFIX


class RoutePolicy(enum.Enum):
    """How a data route behaves while a checkpoint is open."""

    GATED = "gated"  # refused (409 checkpoint_parked); in-flight ones finish before prepare answers
    GATED_NOWAIT = "gated_nowait"  # refused; in-flight ones are the participant's business (cut, held)
    OPEN = "open"  # always served (agent /run parks itself; stateless replay /verify)


PolicyResolver = Callable[[str, str], RoutePolicy]
BYPASS_PREFIXES = (f"{CONTROL_PREFIX}/", "/health/", "/metrics")
BYPASS_PATHS = frozenset({"/", "/metrics"})


@dataclass
class InFlight:
    method: str
    path: str
    policy: RoutePolicy
    started: float
    identity: RolloutIdentity | None


class Admission:
    """Open/closed flag, the in-flight table, and the fence check for data requests."""

    def __init__(self, resolve: PolicyResolver) -> None:
        self.resolve = resolve
        self.is_open = True
        self.inflight: dict[int, InFlight] = {}
        self._ids = itertools.count()
        self.refused = 0

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


def is_bypassed(path: str) -> bool:
    return path in BYPASS_PATHS or path.startswith(BYPASS_PREFIXES)


class AdmissionMiddleware:
    def __init__(self, app: ASGIApp, plane) -> None:  # plane: ControlPlane (import cycle)
        self.app = app
        self.plane = plane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_bypassed(scope["path"]):
            await self.app(scope, receive, send)
            return
        plane = self.plane
        admission: Admission = plane.admission
        policy = admission.resolve(scope["method"], scope["path"])
        try:
            identity = RolloutIdentity.from_headers(_headers(scope))
            if identity is not None:
                plane.fence.check(identity)
            if not admission.is_open and policy is not RoutePolicy.OPEN:
                admission.refused += 1
                raise ApiError(
                    ErrorCode.CHECKPOINT_PARKED,
                    f"checkpoint {plane.checkpoint_id} is open on {plane.participant_id}; retry after resume",
                    details={"checkpoint_id": plane.checkpoint_id, "phase": plane.phase},
                )
            if identity is not None:
                plane.fence.observe(identity)
        except ApiError as exc:
            plane.metrics.refused.labels(code=exc.code).inc()
            await exc.response(headers={"retry-after": "0.1"} if exc.code is ErrorCode.CHECKPOINT_PARKED else None)(
                scope, receive, send
            )
            return
        request_id = next(admission._ids)
        admission.inflight[request_id] = InFlight(scope["method"], scope["path"], policy, time.monotonic(), identity)
        try:
            await self.app(scope, receive, send)
        finally:
            del admission.inflight[request_id]


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
