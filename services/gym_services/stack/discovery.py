"""Participants of a running local stack, for the coordinator.

Called by the CLI's stack commands (:mod:`gym_services.commands.stack`) and the demo story.
"""

from __future__ import annotations

import asyncio

from gym_services.control.models import Replica
from gym_services.control.protocol import Role
from gym_services.coordination.client import ControlClient, ParticipantError, ParticipantRef
from gym_services.stack.external import ExternalServer
from gym_services.stack.launcher import RunningServer, StackError, StackState


async def discover(state: StackState, client: ControlClient) -> list[ParticipantRef]:
    """Ask each participant server its role (status route); the process name is the participant id, and
    each says which replica of its server it is (every server is replica 0 of 1 unless it has replicas). The stack's
    external participants (``external:`` in its YAML) take part as the servers it started do.

    A server that does not answer is a :class:`StackError` naming it (its role is what we asked for)."""

    async def one(server: RunningServer | ExternalServer) -> ParticipantRef:
        probe = ParticipantRef(server.name, Role.RESOURCES, server.url)  # the role is what we ask for
        try:
            status = await client.status(probe, timeout_s=10)
        except ParticipantError as exc:
            raise StackError(f"{server.name} ({server.server}) at {server.url} does not answer: {exc.reason}") from None
        replica = Replica(group=server.group_name, ordinal=server.ordinal, replicas=server.replicas)
        return ParticipantRef(status.participant_id, status.role, server.url, replica=replica)

    servers: list[RunningServer | ExternalServer] = [
        *state.participants(),
        *(s for s in state.external if s.participant),
    ]
    results = await asyncio.gather(*(one(s) for s in servers), return_exceptions=True)
    refs = [r for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return refs
