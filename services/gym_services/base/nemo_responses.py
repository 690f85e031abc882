"""Responses API objects as NeMo Gym's servers take them in and write them back out.

A NeMo Gym resources server validates the ``responses_create_params`` and ``response`` of every
``/verify`` (and Gymnasium ``/reset``/``/step``) body against its own models of the OpenAI
Responses API, and a ``/verify`` answer echoes both in *canonical* form: every declared field
present (``null`` when unset), in declaration order, unknown keys dropped or kept after the
declared ones depending on the object. Agents pass that echo to training, so our servers echo the
same bytes. The models here describe that wire format (from NeMo Gym 0.7.0 with openai 2.44.0, the
specification; see ``tests/conformance``):

- :class:`CreateParams` — the request parameters: unknown keys refused (``extra_forbidden``).
- :class:`ResponseObject` — a response: unknown keys kept after the declared fields.
- output/input items are told apart as NeMo Gym does (by ``type``, and for ``"message"`` by role,
  content and status): an assistant message of ``output_text``/``refusal`` parts, an "easy" message
  (string content, any role), an input message, a function call, a function-call output and a
  reasoning item each have their canonical form. Items of the other OpenAI types (web search, MCP,
  computer use ...) are accepted and echoed as given; none of the shipped environments produces
  them.

:meth:`ResponseObject.output_text` is the text a NeMo Gym server reads from a response. Validation
errors keep pydantic's own types and messages, so ``nemo_http`` renders them as FastAPI would; for
errors *inside* an output or input item NeMo Gym's messages also name its internal union members,
which ours do not (the status, 422, is the same).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag
from pydantic_core import PydanticCustomError

Status = Literal["in_progress", "completed", "incomplete"]
_STATUSES = frozenset({"in_progress", "completed", "incomplete"})
_SIMPLE_ROLES = frozenset({"user", "system", "developer"})
_OUTPUT_PARTS = frozenset({"output_text", "refusal"})


class _Open(BaseModel):
    """An OpenAI SDK object: unknown keys are kept, after the declared fields."""

    model_config = ConfigDict(extra="allow")


# --- content parts and items ------------------------------------------------------------------


class OutputText(BaseModel):
    annotations: list[Any]
    text: str
    type: Literal["output_text"] = "output_text"
    logprobs: list[Any] | None = None


class Refusal(BaseModel):
    refusal: str
    type: Literal["refusal"] = "refusal"


class OutputMessage(BaseModel):
    id: str
    content: list[OutputText | Refusal]
    role: Literal["assistant"] = "assistant"
    status: Status = "completed"
    type: Literal["message"] = "message"
    phase: Literal["commentary", "final_answer"] | None = None


def _typed_part(value: Any) -> Any:
    """An input content part keeps its keys in the SDK's declared order (``text`` before ``type``)."""
    if isinstance(value, dict) and value.get("type") == "input_text" and set(value) == {"text", "type"}:
        return {"text": value["text"], "type": "input_text"}
    return value


InputPart = Annotated[Any, BeforeValidator(_typed_part)]


class EasyMessage(BaseModel):
    content: str | list[InputPart]
    role: Literal["user", "assistant", "system", "developer"]
    type: Literal["message"] = "message"
    phase: Literal["commentary", "final_answer"] | None = None


class InputMessage(BaseModel):
    content: list[InputPart]
    role: Literal["user", "system", "developer"]
    status: Status = "completed"
    type: Literal["message"] = "message"


class FunctionCall(BaseModel):
    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"] = "function_call"
    id: str | None = None
    status: Status | None = None
    namespace: str | None = None


class FunctionCallOutput(BaseModel):
    """A function's result as an agent puts it into the conversation."""

    call_id: str
    output: str | list[Any]
    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    status: Status | None = None


class FunctionCallOutputItem(_Open):
    """A function's result as a provider reports it (with an id and a status)."""

    id: str
    call_id: str
    output: str | list[Any]
    status: Status
    type: Literal["function_call_output"]
    created_by: str | None = None


class SummaryText(_Open):
    text: str
    type: Literal["summary_text"]


class ReasoningText(_Open):
    text: str
    type: Literal["reasoning_text"]


class ReasoningItem(BaseModel):
    id: str
    summary: list[SummaryText]
    type: Literal["reasoning"] = "reasoning"
    encrypted_content: str | None = None
    content: list[ReasoningText] | None = None


#: the item types NeMo Gym accepts beyond the ones modelled here (echoed as given by ours)
_OTHER_TYPES = (
    "mcp_call", "mcp_list_tools", "mcp_approval_request", "file_search_call", "web_search_call", "computer_call",
    "image_generation_call", "code_interpreter_call", "local_shell_call", "custom_tool_call", "computer_call_output",
    "custom_tool_call_output", "local_shell_call_output", "mcp_approval_response", "apply_patch_call",
    "apply_patch_call_output", "compaction", "shell_call", "shell_call_output", "tool_search_call", "tool_search_output",
)
_TRAINING = ("easy_message", "input_message", "output_message", "function_call", "reasoning")
_TOKEN_FIELDS = frozenset({"prompt_token_ids", "generation_token_ids", "generation_log_probs"})
#: the tags NeMo Gym's item unions name in their errors, in its order
OUTPUT_TAGS = (
    "output_message", "function_call", "function_call_output", "reasoning", *_OTHER_TYPES, "additional_tools",
    "easy_message", "input_message", "function_call_output_input", *(f"{t}__training" for t in _TRAINING[:3]),
    *(f"{t}__training" for t in _TRAINING[3:]),
)
INPUT_TAGS = (
    "easy_message", "input_message", "output_message", "function_call", "function_call_output", "reasoning",
    *_OTHER_TYPES, "compaction_trigger", "additional_tools", *(f"{t}__training" for t in _TRAINING),
)
_OUTPUT_DISCRIMINATOR = "_discriminate_response_output_item()"
_INPUT_DISCRIMINATOR = "_discriminate_response_input_item()"


def _first_part_type(content: Any) -> Any:
    if not isinstance(content, list) or not content:
        return None
    first = content[0]
    if isinstance(first, dict):
        return first.get("type") or ("refusal" if "refusal" in first else None)
    return None


def _message_kind(value: dict[str, Any]) -> str:
    """Which message model a ``"message"`` item is: by role, content and status."""
    content = value.get("content")
    if value.get("role") in _SIMPLE_ROLES:
        return "input_message" if isinstance(content, list) and value.get("status") in _STATUSES else "easy_message"
    if isinstance(content, list):
        if content:
            if _first_part_type(content) in _OUTPUT_PARTS:
                return "output_message"
        elif isinstance(value.get("id"), str):
            return "output_message"
    return "easy_message"


def _untyped_kind(value: dict[str, Any]) -> str:
    """An input item without ``type``: inferred from its shape (else an item ours echoes as given)."""
    role, content = value.get("role"), value.get("content")
    if role in (_SIMPLE_ROLES | {"assistant"}) and isinstance(content, (str, list)):
        kind = _message_kind(value)
        if kind == "output_message":
            return kind if isinstance(value.get("id"), str) else "other"
        return kind if _first_part_type(content) not in _OUTPUT_PARTS else "other"
    if "role" not in value and isinstance(value.get("id"), str) and isinstance(content, list):
        if not content or _first_part_type(content) in _OUTPUT_PARTS:
            return "output_message"
    if "arguments" in value and "name" in value:
        return "function_call" if "call_id" in value else "other"
    if isinstance(value.get("call_id"), str) and "output" in value:
        return "function_call_output"
    if isinstance(value.get("id"), str) and isinstance(value.get("summary"), list):
        return "reasoning"
    return "other"


def _item_kind(value: Any, *, output: bool) -> str:
    """The union member an item validates as; refuses, as NeMo Gym's discriminator does, an item
    that is not an object or whose ``type`` is none NeMo Gym knows."""
    tags, discriminator = (OUTPUT_TAGS, _OUTPUT_DISCRIMINATOR) if output else (INPUT_TAGS, _INPUT_DISCRIMINATOR)
    if not isinstance(value, dict):
        raise PydanticCustomError(
            "union_tag_not_found", "Unable to extract tag using discriminator {discriminator}",
            {"discriminator": discriminator},
        )
    kind = value.get("type")
    if kind == "message":
        tag = _message_kind(value)
    elif kind == "function_call_output" and output:
        provider = isinstance(value.get("id"), str) and value.get("status") in _STATUSES
        tag = "function_call_output_item" if provider else "function_call_output"
    elif kind in ("function_call", "function_call_output", "reasoning"):
        tag = kind
    elif kind is None and not output:
        tag = _untyped_kind(value)
    elif isinstance(kind, str) and kind in tags and kind not in ("function_call_output_input",):
        tag = "other"
    else:
        expected = ", ".join(f"'{t}'" for t in tags)
        raise PydanticCustomError(
            "union_tag_invalid",
            "Input tag '{tag}' found using {discriminator} does not match any of the expected tags: {expected_tags}",
            {"discriminator": discriminator, "tag": str(kind), "expected_tags": expected},
        )
    if tag in _TRAINING and _TOKEN_FIELDS <= set(value):
        return "other"  # a training variant carrying token ids: echoed as given
    return tag


def _require_type(value: Any) -> Any:
    if isinstance(value, dict) and "type" not in value:
        raise ValueError("Responses API output items must include a type discriminator")
    return value


def _instance_kind(value: BaseModel) -> str:
    """The tag of an already validated item (when it is serialised)."""
    return _TAG_OF[type(value)]


def _output_kind(value: Any) -> str:
    return _instance_kind(value) if isinstance(value, BaseModel) else _item_kind(value, output=True)


def _input_kind(value: Any) -> str:
    return _instance_kind(value) if isinstance(value, BaseModel) else _item_kind(value, output=False)


def _check_output_item(value: Any) -> Any:
    _output_kind(value)  # raises the discriminator's errors at the item's own location
    return value


def _check_input_item(value: Any) -> Any:
    _input_kind(value)
    return value


_TAG_OF: dict[type, str] = {
    OutputMessage: "output_message", EasyMessage: "easy_message", InputMessage: "input_message",
    FunctionCall: "function_call", FunctionCallOutput: "function_call_output",
    FunctionCallOutputItem: "function_call_output_item", ReasoningItem: "reasoning",
}

OutputItem = Annotated[
    Annotated[OutputMessage, Tag("output_message")]
    | Annotated[EasyMessage, Tag("easy_message")]
    | Annotated[InputMessage, Tag("input_message")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output_item")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[dict[str, Any], Tag("other")],
    Discriminator(_output_kind),
    BeforeValidator(_check_output_item),
    BeforeValidator(_require_type),
]

InputItem = Annotated[
    Annotated[OutputMessage, Tag("output_message")]
    | Annotated[EasyMessage, Tag("easy_message")]
    | Annotated[InputMessage, Tag("input_message")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[dict[str, Any], Tag("other")],
    Discriminator(_input_kind),
    BeforeValidator(_check_input_item),
]


# --- request parameters -----------------------------------------------------------------------


def _function_tool_param(value: Any) -> Any:
    """A function tool keeps the SDK's declared key order."""
    order = ("name", "parameters", "strict", "type", "defer_loading", "description")
    if isinstance(value, dict) and value.get("type") == "function" and set(value) <= set(order):
        return {k: value[k] for k in order if k in value}
    return value


def _tool_choice_param(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "function" and set(value) == {"name", "type"}:
        return {"name": value["name"], "type": "function"}
    return value


class ReasoningConfig(_Open):
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    effort: str | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]


class CreateParams(BaseModel):
    """``responses_create_params``: what the agent asks the model for (non-streaming)."""

    model_config = ConfigDict(extra="forbid")

    background: bool | None = None
    include: list[Any] | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt: Any = None
    reasoning: ReasoningConfig | None = None
    service_tier: ServiceTier | None = None
    store: bool | None = None
    context_management: list[Any] | None = None
    conversation: Any = None
    moderation: Any = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    safety_identifier: str | None = None
    stream_options: Any = None
    temperature: float | None = None
    text: Any = None
    tool_choice: Annotated[Any, BeforeValidator(_tool_choice_param)] = "auto"
    tools: list[Annotated[Any, BeforeValidator(_function_tool_param)]] = Field(default_factory=list)
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    stream: Literal[False] | None = None


# --- the response -----------------------------------------------------------------------------


class ResponseErrorObject(_Open):
    code: str
    message: str


class IncompleteDetails(_Open):
    reason: Literal["max_output_tokens", "content_filter"] | None = None


class FunctionTool(_Open):
    name: str
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    type: Literal["function"]
    defer_loading: bool | None = None
    description: str | None = None


def _response_tool(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "function":
        return FunctionTool.model_validate(value)
    return value


class ToolChoiceFunction(_Open):
    name: str
    type: Literal["function"]


def _response_tool_choice(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "function":
        return ToolChoiceFunction.model_validate(value)
    return value


class TextConfig(_Open):
    format: Any = None
    verbosity: Literal["low", "medium", "high"] | None = None


class InputTokensDetails(_Open):
    cached_tokens: int | None


class OutputTokensDetails(_Open):
    reasoning_tokens: int | None


class Usage(_Open):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseObject(_Open):
    """``response``: what the model answered."""

    id: str
    created_at: float
    error: ResponseErrorObject | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | list[InputItem] | None = None
    metadata: dict[str, str] | None = None
    model: str
    object: Literal["response"]
    output: list[OutputItem]
    parallel_tool_calls: bool
    temperature: float | None = None
    tool_choice: Annotated[Any, BeforeValidator(_response_tool_choice)]
    tools: list[Annotated[Any, BeforeValidator(_response_tool)]]
    top_p: float | None = None
    background: bool | None = None
    completed_at: float | None = None
    conversation: Any = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    moderation: Any = None
    previous_response_id: str | None = None
    prompt: Any = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    reasoning: ReasoningConfig | None = None
    safety_identifier: str | None = None
    service_tier: ServiceTier | None = None
    status: Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"] | None = None
    text: TextConfig | None = None
    top_logprobs: int | None = None
    truncation: Literal["auto", "disabled"] | None = None
    usage: Usage | None = None
    user: str | None = None

    def output_text(self) -> str:
        """Every ``output_text`` part of every message item, joined (what a NeMo Gym server reads).

        A message whose content is a plain string has no parts to read; the OpenAI SDK walks the
        string character by character and fails, which :class:`UnreadableOutput` reports.
        """
        texts: list[str] = []
        for item in self.output:
            if isinstance(item, (OutputMessage, InputMessage)):
                texts.extend(p.text for p in item.content if isinstance(p, OutputText))
                if isinstance(item, InputMessage) and item.content:
                    raise UnreadableOutput("'dict' object has no attribute 'type'")
            elif isinstance(item, EasyMessage):
                if isinstance(item.content, str):
                    if item.content:
                        raise UnreadableOutput("'str' object has no attribute 'type'")
                elif item.content:
                    raise UnreadableOutput("'dict' object has no attribute 'type'")
        return "".join(texts)

    def message_text(self) -> str:
        """The Gymnasium servers' reading: string contents of messages, and their ``output_text`` parts.

        Parts of input messages are plain dicts there and fail the same way as in :meth:`output_text`.
        """
        parts: list[str] = []
        for item in self.output:
            if isinstance(item, EasyMessage) and isinstance(item.content, str):
                parts.append(item.content)
            elif isinstance(item, OutputMessage):
                parts.extend(p.text for p in item.content if isinstance(p, OutputText))
            elif isinstance(item, (EasyMessage, InputMessage)) and item.content:
                raise UnreadableOutput("'dict' object has no attribute 'type'")
        return "".join(parts)


class UnreadableOutput(AttributeError):
    """The reference server fails reading this response's text (an ``AttributeError`` there, too)."""
