"""Wire formats of the indirect prompt injection server (REFERENCE B.2).

Extra fields are allowed throughout: agents post the whole dataset row to
``/seed_session`` and ``/verify`` (``responses_create_params``, ``domain``, ...).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class SeedRequest(_Open):
    environment: dict[str, Any] = Field(description="the task's tool environment; the session keeps a deep copy")


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


class IncompleteDetails(_Open):
    reason: str | None = None


class RolloutResponse(_Open):
    """The part of a Responses API response the verifier reads."""

    output: list[Any] = Field(default_factory=list)
    incomplete_details: IncompleteDetails | None = None


class VerifyRequest(_Open):
    response: RolloutResponse
    injection: InjectionSpec
    required_tools: list[str] = Field(default_factory=list)


class ToolOutput(BaseModel):
    output: str
