"""Shared machinery of the resources and environment servers: the session participant by mode, the session hooks."""

from gym_services.resources.common.hooks import SessionHooks, SharedStateHooks
from gym_services.resources.common.participant import (
    ExportedParticipant,
    RestartOnlyParticipant,
    SessionParticipant,
    StatelessParticipant,
    participant_for,
    session_not_found,
)

__all__ = [
    "ExportedParticipant",
    "RestartOnlyParticipant",
    "SessionHooks",
    "SessionParticipant",
    "SharedStateHooks",
    "StatelessParticipant",
    "participant_for",
    "session_not_found",
]
