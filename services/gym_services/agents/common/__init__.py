"""Shared machinery of the agents: boundaries, the agent participant, the downstream client."""

from gym_services.agents.common.boundary import RETURN, Boundary, EpisodeRecord, Usage, task_row
from gym_services.agents.common.config import AgentConfig
from gym_services.agents.common.context import MODEL, StepContext
from gym_services.agents.common.downstream import CheckpointParked, Downstream, Reply
from gym_services.agents.common.episode import Episode
from gym_services.agents.common.loop import AgentLoop, StepKind
from gym_services.agents.common.participant import AgentParticipant
from gym_services.agents.common.service import create_agent_app

__all__ = [
    "MODEL",
    "RETURN",
    "AgentConfig",
    "AgentLoop",
    "AgentParticipant",
    "Boundary",
    "CheckpointParked",
    "Downstream",
    "Episode",
    "EpisodeRecord",
    "Reply",
    "StepContext",
    "StepKind",
    "Usage",
    "create_agent_app",
    "task_row",
]
