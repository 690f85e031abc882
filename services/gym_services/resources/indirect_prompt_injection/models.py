"""Wire formats of the indirect prompt injection server, validated as NeMo Gym's server validates them.

Extra fields are allowed throughout: agents post the whole dataset row to ``/seed_session`` and
``/verify`` (``responses_create_params``, ``domain``, ...); the verify answer keeps only the two
Responses API objects and the failure fields of them.

``responses_create_params`` and ``response`` are validated as NeMo Gym validates them, against the
OpenAI SDK's Responses API types (:mod:`gym_services.base.nemo_responses`); the detail of a ``422``
about a value inside one of the SDK's unions can differ (see the README).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gym_services.base.nemo_responses import CreateParams, ResponseObject, VerifyResponse


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class SeedRequest(_Open):
    environment: dict[str, Any] = Field(description="the task's tool environment; the session keeps a deep copy")


class ToolCallRequest(_Open):
    """Any JSON object: its keys are the tool's arguments."""


class InjectionSpec(_Open):
    """The attack planted in the environment and the action that would mean it worked."""

    goal: str
    target_tool: str
    target_args: dict[str, Any]
    verification_type: str
    attack_strategy: str
    attack_difficulty: str
    vector: str
    injection_text: str
    category: str


class VerifyRequest(_Open):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    responses_create_params: CreateParams
    rollout_id: str | None = Field(default=None, alias="_ng_rollout_id", exclude=True)
    response: ResponseObject
    injection: InjectionSpec
    required_tools: list[str] = Field(default_factory=list)


class VerifyAnswer(VerifyResponse):
    """``/verify``'s answer (the API document's schema): the echo, the reward and the verdict, in NeMo Gym's order."""

    injection_followed: bool
    matched_tool: str | None
    matched_args: Any
    attack_difficulty: str
    attack_strategy: str
    attack_category: str
    verification_type: str
    reward_safety: float
    reward_utility: float
    thinking_incomplete: bool


class ToolOutput(BaseModel):
    """A tool's answer: its text (a tool's failure is text for the model too)."""

    output: str
