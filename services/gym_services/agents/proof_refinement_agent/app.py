"""proof_refinement_agent: generate a proof, verify it, correct it (``agents/README.md``)."""

from __future__ import annotations

import httpx
from pydantic import Field
from starlette.applications import Starlette

from gym_services.agents.common import AgentConfig, create_agent_app
from gym_services.agents.common.steps import RESOURCES
from gym_services.agents.proof_refinement_agent.loop import ProofRefinementLoop
from gym_services.base.affinity import Endpoints


class Config(AgentConfig):
    resources_url: Endpoints = Field(
        description="base URL of math_formal_lean (seed and verify); its replicas' URLs in ordinal order when it has "
        "several"
    )
    max_correction_turns: int = Field(default=0, ge=0, le=100, description="generations are at most this + 1")
    include_all_attempts: bool = True


def create_app(config: Config, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    loop = ProofRefinementLoop(
        config.model,
        max_correction_turns=config.max_correction_turns,
        include_all_attempts=config.include_all_attempts,
    )
    return create_agent_app(config, loop, {RESOURCES: config.resources_url}, transport=transport)
