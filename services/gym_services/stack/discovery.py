"""Participants of a running local stack, for the coordinator."""

from __future__ import annotations

import asyncio

from gym_services.control.protocol import Role
from gym_services.coordination.client import ControlClient, ParticipantError, ParticipantRef
from gym_services.stack.launcher import StackState


async def discover(state: StackState, client: ControlClient) -> list[ParticipantRef]:
    """Ask each participant server its role (status route); the instance name is the participant id."""

    async def one(server) -> ParticipantRef:
        probe = ParticipantRef(server.name, Role.RESOURCES, server.url)  # the role is what we ask for
        status = await client.status(probe, timeout_s=10)
        return ParticipantRef(status.participant_id, status.role, server.url)

    results = await asyncio.gather(*(one(s) for s in state.participants()), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise ParticipantError(errors[0].ref, "status", errors[0].reason) if isinstance(errors[0], ParticipantError) else errors[0]
    return list(results)  # type: ignore[arg-type]
