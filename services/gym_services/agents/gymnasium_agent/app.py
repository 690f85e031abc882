"""gymnasium_agent: ``/reset`` then (model -> ``/step``)* against an environment server (``agents/README.md``)."""

from __future__ import annotations

import httpx
from pydantic import Field
from starlette.applications import Starlette

from gym_services.agents.common import AgentConfig, create_agent_app
from gym_services.agents.gymnasium_agent.loop import ENV, GymnasiumLoop
from gym_services.base.affinity import Endpoints


class Config(AgentConfig):
    env_url: Endpoints = Field(
        description="base URL of the environment server (/reset, /step, /close); its replicas' URLs in ordinal order "
        "when it has several"
    )
    max_steps: int = Field(default=10, ge=1, le=10_000, description="environment steps per episode")


def create_app(config: Config, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    loop = GymnasiumLoop(config.model, max_steps=config.max_steps)
    return create_agent_app(config, loop, {ENV: config.env_url}, transport=transport)
