"""Stacks of the real servers in process: policy model (over the worker process), agent, resources/environment.

Only the Lean sandbox is stood in (math_formal_lean's own stand-in app). Every app is a
fresh instance per stack, so a restored stack shares nothing in memory with the first.
"""

from __future__ import annotations

from typing import Any

from tests.services.agents.stack import StackFactory, wait_for
from tests.services.agents.wire import Call, Wire
from tests.support.asgi import base_config

from gym_services.agents.gymnasium_agent.app import Config as GymConfig
from gym_services.agents.gymnasium_agent.app import create_app as gymnasium_agent
from gym_services.agents.proof_refinement_agent.app import Config as ProofConfig
from gym_services.agents.proof_refinement_agent.app import create_app as proof_agent
from gym_services.agents.simple_agent.app import Config as SimpleConfig
from gym_services.agents.simple_agent.app import create_app as simple_agent
from gym_services.base.config import load_config
from gym_services.models.policy_model.app import Config as ModelConfig
from gym_services.models.policy_model.app import create_app as policy_model
from gym_services.resources.blackjack.app import Config as BlackjackConfig
from gym_services.resources.blackjack.app import create_app as blackjack
from gym_services.resources.indirect_prompt_injection.app import Config as IpiConfig
from gym_services.resources.indirect_prompt_injection.app import create_app as ipi
from gym_services.resources.math_formal_lean import sandbox_standin
from gym_services.resources.math_formal_lean.app import Config as LeanConfig
from gym_services.resources.math_formal_lean.app import create_app as math_formal_lean
from gym_services.resources.workplace_assistant.app import Config as WorkplaceConfig
from gym_services.resources.workplace_assistant.app import create_app as workplace

#: a policy model that puts token ids and log-probs on its responses and records every call in its token ledger
TOKENS = {"return_token_id_information": True, "record_tokens": True}


def model_app(worker_url: str, **extra: Any):
    return policy_model(
        load_config(ModelConfig, overrides=base_config("model", upstream={"base_url": f"{worker_url}/v1"}, **extra))
    )


def agent_overrides(model: str, **extra: Any) -> dict[str, Any]:
    return base_config("agent", model_url="http://model", model=model, **extra)


def proof_stack(worker_url: str, *, max_correction_turns: int = 2) -> StackFactory:
    def make(wire: Wire):
        config = load_config(
            ProofConfig,
            overrides=agent_overrides(
                "lean-refine", resources_url="http://lean", max_correction_turns=max_correction_turns
            ),
        )
        lean = load_config(LeanConfig, overrides=base_config("lean", sandbox_host="sandbox", sandbox_port=6000))
        return {
            "model": ("model", model_app(worker_url)),
            "agent": ("agent", proof_agent(config, transport=wire)),
            "lean": ("resources", math_formal_lean(lean, sandbox_transport=wire)),
            "sandbox": (None, sandbox_standin.create_app()),
        }

    return make


def simple_stack(
    worker_url: str, environment: str, model: str, *, tool_latency_s: float = 0.0, tokens: bool = False
) -> StackFactory:
    """simple_agent over the policy model and ``environment``; ``tokens``: the model reports and records tokens
    (:data:`TOKENS`)."""

    def make(wire: Wire):
        config = load_config(
            SimpleConfig, overrides=agent_overrides(model, resources_url="http://resources", max_steps=20)
        )
        if environment == "workplace_assistant":
            resources = workplace(
                load_config(WorkplaceConfig, overrides=base_config("resources", tool_latency_s=tool_latency_s))
            )
        else:
            resources = ipi(load_config(IpiConfig, overrides=base_config("resources")))
        return {
            "model": ("model", model_app(worker_url, **(TOKENS if tokens else {}))),
            "agent": ("agent", simple_agent(config, transport=wire)),
            "resources": ("resources", resources),
        }

    return make


def gym_stack(worker_url: str, *, step_latency_s: float = 0.0, max_steps: int = 10) -> StackFactory:
    def make(wire: Wire):
        config = load_config(
            GymConfig, overrides=agent_overrides("blackjack-basic", env_url="http://env", max_steps=max_steps)
        )
        env = blackjack(load_config(BlackjackConfig, overrides=base_config("env", step_latency_s=step_latency_s)))
        return {
            "model": ("model", model_app(worker_url)),
            "agent": ("agent", gymnasium_agent(config, transport=wire)),
            "env": ("environment", env),
        }

    return make


def model_calls(wire: Wire) -> list[Call]:
    """Successful generations the agent asked for."""
    return wire.data_calls("model", "/v1/responses", ok=True)


def model_totals(app) -> dict[str, int]:
    """tokens_generated / tokens_reused / generations_cut / responses_held of one policy model instance."""
    return dict(app.state.generations.totals)


def live_generation_tokens(app) -> int:
    return max((g.completion_tokens for g in app.state.generations.live.values()), default=0)


def generation_streaming(match):
    """An ``arrange`` for checkpoint_and_continue: wait until the model call ``match`` selects has streamed tokens."""

    async def arrange(s):
        sent = s.wire.watch(match)
        model = s.wire.apps["model"]

        async def reached():
            await sent.wait()
            await wait_for(lambda: live_generation_tokens(model) >= 5, what="tokens of the generation")

        return reached

    return arrange
