"""The participant of an episode (Gymnasium-style) server: role ``environment`` (``docs/participants.md``, "Resources
and environment servers").

Built by the blackjack app (:mod:`gym_services.resources.blackjack.app`). It is the exported session
participant with episodes for sessions: an episode is tracked at ``/reset`` under its cookie
session id and the rollout identity of the call, exported with the server's session hooks,
installed under attempt + 1 at restore, dropped by retire, and ended when the episode is done.
Steps are GATED routes, so an in-flight step finishes before prepare answers and new steps get
``409 checkpoint_parked``.
"""

from __future__ import annotations

from typing import Any

from gym_services.control.protocol import Role, VerifyMode
from gym_services.resources.blackjack.game import Episode
from gym_services.resources.common import ExportedParticipant, SessionHooks


class EpisodeParticipant(ExportedParticipant[dict[str, Episode]]):
    """``exported`` episodes; ``verify`` stays ``wait``: a step mutates state and is waited for."""

    def __init__(self, hooks: SessionHooks[dict[str, Episode]], *, verify: VerifyMode = VerifyMode.WAIT) -> None:
        super().__init__(hooks, verify=verify, role=Role.ENVIRONMENT)

    def live(self) -> dict[str, Any]:
        return {"episodes": len(self.sessions)}
