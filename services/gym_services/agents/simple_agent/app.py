"""simple_agent: the tool-calling loop against a resources server (``agents/README.md``)."""

from __future__ import annotations

import httpx
from pydantic import Field
from starlette.applications import Starlette

from gym_services.agents.common import AgentConfig, create_agent_app
from gym_services.agents.common.steps import RESOURCES
from gym_services.agents.simple_agent.loop import SimpleAgentLoop
from gym_services.base.affinity import Endpoints


class Config(AgentConfig):
    resources_url: Endpoints = Field(
        description="base URL of the resources server (seed, tools, verify); its replicas' URLs in ordinal order when "
        "it has several"
    )
    max_steps: int | None = Field(default=None, ge=1, description="model calls per episode; unbounded when null")
    skip_verification: bool = False
    skip_verification_reward: float = 0.0


def create_app(config: Config, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    loop = SimpleAgentLoop(
        config.model,
        max_steps=config.max_steps,
        skip_verification=config.skip_verification,
        skip_verification_reward=config.skip_verification_reward,
    )
    return create_agent_app(config, loop, {RESOURCES: config.resources_url}, transport=transport)
