"""The participant of an episode (Gymnasium-style) server: role ``environment`` (DESIGN §6).

It is the resources participant with episodes for sessions: an episode is tracked at
``/reset`` under its cookie session id and the rollout identity of the call, exported
with the server's session hooks, installed under attempt + 1 at restore, dropped by
retire, and ended when the episode is done. Steps are GATED routes, so an in-flight
step finishes before prepare answers and new steps get ``409 checkpoint_parked``.
"""

from __future__ import annotations

from typing import Any

from gym_services.base.identity import RolloutIdentity
from gym_services.control.models import VerifyMode
from gym_services.resources.common.sessions import ResourcesParticipant, SessionHooks


class EpisodeParticipant(ResourcesParticipant):
    """``exported`` episodes; ``verify`` stays ``wait``: a step mutates state and is waited for."""

    def __init__(self, hooks: SessionHooks, *, verify: VerifyMode = "wait") -> None:
        super().__init__(hooks, mode="exported", verify=verify, role="environment")

    def begin(self, session_id: str, identity: RolloutIdentity | None) -> None:
        """A ``/reset`` started an episode (a new one replaces the session's old one)."""
        self.track(session_id, identity)

    def live(self) -> dict[str, Any]:
        return {"episodes": len(self.sessions)}
