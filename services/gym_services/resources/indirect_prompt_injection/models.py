"""Wire formats of the indirect prompt injection server, validated as NeMo Gym's server validates them.

Extra fields are allowed throughout: agents post the whole dataset row to ``/seed_session`` and
``/verify`` (``responses_create_params``, ``domain``, ...), and ``/verify`` echoes them. Field
order matters: it is the order of the keys ``/verify`` answers with.

NeMo Gym validates ``responses_create_params`` and ``response`` against the OpenAI SDK's
Responses API types. Ours check what scoring and the common agent mistakes need (the required
fields of a response and their basic types, function calls with text arguments); the detail of a
``422`` about deeper parts of those two objects can differ (see the README).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


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


class IncompleteDetails(_Open):
    reason: Literal["max_output_tokens", "content_filter"] | None = None


class FunctionCallItem(_Open):
    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"] = "function_call"


class OtherItem(_Open):
    type: str


def _item_kind(value: Any) -> str:
    if isinstance(value, dict) and value.get("type") == "function_call":
        return "function_call"
    return "other"


#: an output item: function calls are checked as such, other items need a type
OutputItem = Annotated[
    Union[Annotated[FunctionCallItem, Tag("function_call")], Annotated[OtherItem, Tag("other")]],
    Discriminator(_item_kind),
]


class RolloutResponse(_Open):
    """A Responses API response: the fields every response has, and the output the verifier reads."""

    id: str
    created_at: float
    incomplete_details: IncompleteDetails | None = None
    model: str
    object: Literal["response"]
    output: list[OutputItem]
    parallel_tool_calls: bool
    tool_choice: Any
    tools: list[Any]


class CreateParams(_Open):
    input: str | list[Any]


class VerifyRequest(_Open):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    responses_create_params: CreateParams
    rollout_id: str | None = Field(default=None, alias="_ng_rollout_id", exclude=True)
    response: RolloutResponse
    injection: InjectionSpec
    required_tools: list[str] = Field(default_factory=list)
