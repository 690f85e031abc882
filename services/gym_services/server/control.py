"""The control plane as every participant carries it, whoever built the app around it.

:class:`ServerControl` is built once per server: the Prometheus registry with the control plane's metrics on it, the
:class:`~gym_services.control.admission.Admission` (open or closed, the attempt fence), the
:class:`~gym_services.control.plane.ControlPlane`, and what an app mounts of them: the control routes behind the
bearer token and the admission middleware of the data routes. :func:`gym_services.server.app.create_server_app` builds
one while it builds an app; :func:`gym_services.adapters.control.mount_control_plane` builds one for an app that
another framework made (a FastAPI app). Both apps are then the same participant to the coordinator.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from gym_services.base.config import ServerConfig
from gym_services.base.metrics import Metrics
from gym_services.control.admission import Admission, AdmissionMiddleware, PolicyResolver
from gym_services.control.metrics import ControlMetrics
from gym_services.control.participant import Participant
from gym_services.control.plane import ControlPlane
from gym_services.control.routes import control_mount


@dataclass(frozen=True)
class ServerControl:
    """One server's control plane and what an app mounts of it (see the module)."""

    config: ServerConfig
    participant: Participant[Any, Any]
    metrics: Metrics
    control_metrics: ControlMetrics
    admission: Admission
    plane: ControlPlane[Any, Any]

    @classmethod
    def build(
        cls,
        config: ServerConfig,
        participant: Participant[Any, Any],
        *,
        metrics: Metrics | None = None,
        admission: Admission | None = None,
    ) -> ServerControl:
        """``metrics`` is the registry the server declared its own metrics on (a fresh one when it has none);
        ``admission`` is given by a server whose participant reads it (the agent parks at boundaries while it is
        closed), else made here. A checkpointing server without its deployment secrets is refused."""
        config.require_secrets()
        metrics = metrics if metrics is not None else Metrics(config.name)
        control_metrics = ControlMetrics.declare(metrics)
        metrics.track_live(participant.live)
        admission = admission if admission is not None else Admission(config.participant_id)
        plane: ControlPlane[Any, Any] = ControlPlane(config, participant, control_metrics, admission)
        return cls(config, participant, metrics, control_metrics, admission, plane)

    @property
    def enabled(self) -> bool:
        """Whether the server takes part in checkpoints (``checkpoint.enabled``): only then are the control routes
        and admission mounted."""
        return self.config.checkpoint.enabled

    def routes(self) -> list[BaseRoute]:
        """The control routes behind the bearer token (none when checkpointing is off)."""
        token = self.config.checkpoint.control_token
        if not self.enabled or token is None:  # require_secrets refused an enabled server without a token
            return []
        return [control_mount(self.plane, token.get_secret_value())]

    def admission_middleware(self, resolve: PolicyResolver) -> list[Middleware]:
        """Fencing and admission for the data routes (none when checkpointing is off). It reads the session's signed
        identity (``base/sessions.py``'s scope keys) when the participant keys its state by session: a middleware
        that sets those keys (the session cookie's) must run before it."""
        if not self.enabled:
            return []
        return [
            Middleware(
                AdmissionMiddleware,
                admission=self.admission,
                resolve=resolve,
                refused=self.control_metrics.refused,
                sessions=self.participant.session_keyed,
            )
        ]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The control plane started for as long as the app serves."""
        await self.plane.start()
        try:
            yield
        finally:
            await self.plane.stop()


__all__ = ["ServerControl"]
