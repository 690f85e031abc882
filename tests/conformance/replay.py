"""Replay a recorded rollout through one of our agents, in process, against a real environment app.

    result = await replay(row, recorded["response"], resources_app, agent="simple_agent")
    assert result.status == 200
    assert function_call_outputs(result.environment_items) == function_call_outputs(environment_items(recorded_output))
    assert result.body["reward"] == recorded["reward"]

The model is a :class:`~tests.conformance.scripted.ScriptedModel` answering the recorded model
turns in order; the agent is our real Starlette app (``simple_agent``, ``proof_refinement_agent``
or ``gymnasium_agent``) with checkpointing on, reached through its ``/run`` route; the environment
is whatever Starlette app the caller passes (its real routes). Downstream calls go through
``tests.services.agents.wire.Wire`` (host-routing ASGI transport), so ``result.wire.calls`` lists
every call the agent made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette

from gym_services.agents.gymnasium_agent.app import Config as GymConfig
from gym_services.agents.gymnasium_agent.app import create_app as gymnasium_agent
from gym_services.agents.proof_refinement_agent.app import Config as ProofConfig
from gym_services.agents.proof_refinement_agent.app import create_app as proof_agent
from gym_services.agents.simple_agent.app import Config as SimpleConfig
from gym_services.agents.simple_agent.app import create_app as simple_agent
from gym_services.base.config import load_config
from tests.conformance.scripted import ScriptedModel, environment_items, recorded_script
from tests.services.agents.wire import Wire, running
from tests.support.asgi import base_config

AGENTS = {
    "simple_agent": (SimpleConfig, simple_agent, "resources_url"),
    "proof_refinement_agent": (ProofConfig, proof_agent, "resources_url"),
    "gymnasium_agent": (GymConfig, gymnasium_agent, "env_url"),
}


@dataclass
class Replayed:
    status: int
    body: Any
    model: ScriptedModel
    rollout_id: str
    wire: Wire

    @property
    def model_requests(self) -> list[Any]:
        """Every request body the agent sent to the model, in order."""
        return self.model.requests(self.rollout_id)

    @property
    def output(self) -> list[dict[str, Any]]:
        """``response.output`` of the /run answer (empty when it has none)."""
        response = self.body.get("response") if isinstance(self.body, dict) else None
        return list((response or {}).get("output") or [])

    @property
    def environment_items(self) -> list[dict[str, Any]]:
        """The items of the final output that the environment produced (function-call outputs, observations)."""
        return environment_items(self.output)


def agent_app(agent: str, transport: httpx.AsyncBaseTransport, **overrides: Any) -> Starlette:
    """Our ``agent`` as an app named ``agent`` whose model is ``http://model`` and environment ``http://env``."""
    config_cls, create, url_field = AGENTS[agent]
    fields = {"model_url": "http://model", url_field: "http://env", **overrides}
    return create(load_config(config_cls, overrides=base_config("agent", **fields)), transport=transport)


async def replay(
    row: Mapping[str, Any],
    recorded_response: Mapping[str, Any],
    environment: Starlette,
    *,
    agent: str = "simple_agent",
    rollout_id: str = "replay-0",
    agent_overrides: Mapping[str, Any] | None = None,
    timeout_s: float = 60.0,
) -> Replayed:
    """Run ``row`` through our ``agent`` with a model that answers the recorded model turns of ``recorded_response``."""
    model = ScriptedModel({rollout_id: recorded_script(recorded_response)})
    wire = Wire()
    wire.apps.update(
        {
            "model": model.app,
            "env": environment,
            "agent": agent_app(agent, wire, **dict(agent_overrides or {})),
        }
    )
    body = {**row, "_ng_rollout_id": rollout_id, "_ng_attempt_index": 0}
    async with running(wire), httpx.AsyncClient(transport=wire, timeout=timeout_s) as http:
        reply = await http.post("http://agent/run", json=body)
    try:
        parsed = reply.json()
    except ValueError:
        parsed = reply.text
    return Replayed(reply.status_code, parsed, model, rollout_id, wire)
