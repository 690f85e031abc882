"""Kept so code written before :mod:`.participant` split the session participant by mode still imports.

New code imports from :mod:`gym_services.resources.common` (or :mod:`.participant`, :mod:`.hooks`).
"""

from __future__ import annotations

from gym_services.control.protocol import VERIFY_HEADER, CheckpointMode, Role, VerifyMode
from gym_services.resources.common.hooks import S, SessionHooks, SharedStateHooks
from gym_services.resources.common.participant import (
    ExportedParticipant,
    RestartOnlyParticipant,
    StatelessParticipant,
    participant_for,
)

__all__ = ["VERIFY_HEADER", "ResourcesParticipant", "SessionHooks", "SharedStateHooks"]


def ResourcesParticipant(
    hooks: SessionHooks[S],
    *,
    mode: CheckpointMode = CheckpointMode.RESTART_ONLY,
    verify: VerifyMode = VerifyMode.WAIT,
    role: Role = Role.RESOURCES,
) -> RestartOnlyParticipant | ExportedParticipant[S] | StatelessParticipant:
    """The participant class of ``mode`` (see :func:`~.participant.participant_for`)."""
    return participant_for(mode, hooks, verify=verify, role=role)
