"""Responses API objects in NeMo Gym's canonical form: what its servers and agents take in and write out.

NeMo Gym parses every ``responses_create_params``, ``response`` and input/output item into typed
models of the OpenAI Responses API and serialises them again: a resources server validates a
``/verify`` (and a Gymnasium ``/reset``/``/step``) body against them and echoes both objects in
*canonical* form, and its agents send rows, model inputs and ``/run`` answers in the same form.
The models here describe that wire format (NeMo Gym 0.7.0 with openai 2.44.0 is the
specification; see ``tests/conformance``), and the same models give every form our servers and
agents write:

- :class:`CreateParams` — the request parameters: unknown keys refused (``extra_forbidden``).
- :class:`ResponseObject` — a response: unknown keys kept after the declared fields.
- output/input items are told apart as NeMo Gym does (by ``type``, and for ``"message"`` by role,
  content and status): an assistant message of ``output_text``/``refusal`` parts, an "easy" message
  (string content, any role), an input message, a function call, a function-call output and a
  reasoning item each have their canonical form. Items of the other OpenAI types (web search, MCP,
  computer use ...) are accepted and echoed as given; none of the shipped environments produces
  them.
- :class:`VerifyResponse` — the fields every ``/verify`` answer has, in NeMo Gym's order.

Two forms of an object (the *forms* below, used by the agents and the servers alike):

- the *full* form (:func:`create_params`, :func:`response`, :func:`item`, :func:`run_row`,
  :func:`verify_answer`): every declared field, defaults filled in (``null``, ``"auto"``, ``[]``
  ...), as in ``/seed_session``, ``/verify``, ``/reset``, ``/step`` bodies, their echoes and ``/run``
  answers;
- the *given* form (``full=False``): only the fields the producer set, as in a model's ``input``
  items.

An object the models refuse (NeMo Gym answers ``422`` for it; our agents pass it on) is formed
field by field from the same declarations, leniently: declared fields in order, item kinds it
cannot tell apart passed through unchanged.

:meth:`ResponseObject.output_text` is the text a NeMo Gym server reads from a response. Validation
errors keep pydantic's own types and messages, so ``nemo_http`` renders them as FastAPI would; for
errors *inside* an output or input item NeMo Gym's messages also name its internal union members,
which ours do not (the status, 422, is the same).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from gym_services.base.token_arrays import TokenArray

Status = Literal["in_progress", "completed", "incomplete"]
_STATUSES = frozenset({"in_progress", "completed", "incomplete"})
_SIMPLE_ROLES = frozenset({"user", "system", "developer"})
_OUTPUT_PARTS = frozenset({"output_text", "refusal"})


class _Open(BaseModel):
    """An OpenAI SDK object: unknown keys are kept, after the declared fields."""

    model_config = ConfigDict(extra="allow")


# --- content parts and items ------------------------------------------------------------------


# The content parts of an output message form an untagged union, whose validation errors name each
# member's class in their location: the classes carry the names NeMo Gym's do, so a 422 reads alike.
class NeMoGymResponseOutputText(BaseModel):
    annotations: list[Any]
    text: str
    type: Literal["output_text"] = "output_text"
    logprobs: list[Any] | None = None


class NeMoGymResponseOutputRefusal(BaseModel):
    refusal: str
    type: Literal["refusal"] = "refusal"


OutputText = NeMoGymResponseOutputText
Refusal = NeMoGymResponseOutputRefusal


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
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "file_search_call",
    "web_search_call",
    "computer_call",
    "image_generation_call",
    "code_interpreter_call",
    "local_shell_call",
    "custom_tool_call",
    "computer_call_output",
    "custom_tool_call_output",
    "local_shell_call_output",
    "mcp_approval_response",
    "apply_patch_call",
    "apply_patch_call_output",
    "compaction",
    "shell_call",
    "shell_call_output",
    "tool_search_call",
    "tool_search_output",
)
_TRAINING = ("easy_message", "input_message", "output_message", "function_call", "reasoning")
_TOKEN_FIELDS = frozenset({"prompt_token_ids", "generation_token_ids", "generation_log_probs"})
#: the tags NeMo Gym's item unions name in their errors, in its order
OUTPUT_TAGS = (
    "output_message",
    "function_call",
    "function_call_output",
    "reasoning",
    *_OTHER_TYPES,
    "additional_tools",
    "easy_message",
    "input_message",
    "function_call_output_input",
    *(f"{t}__training" for t in _TRAINING[:3]),
    *(f"{t}__training" for t in _TRAINING[3:]),
)
INPUT_TAGS = (
    "easy_message",
    "input_message",
    "output_message",
    "function_call",
    "function_call_output",
    "reasoning",
    *_OTHER_TYPES,
    "compaction_trigger",
    "additional_tools",
    *(f"{t}__training" for t in _TRAINING),
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
    if (
        "role" not in value
        and isinstance(value.get("id"), str)
        and isinstance(content, list)
        and (not content or _first_part_type(content) in _OUTPUT_PARTS)
    ):
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
            "union_tag_not_found",
            "Unable to extract tag using discriminator {discriminator}",
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
    if tag in _TRAINING and set(value) >= _TOKEN_FIELDS:
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
    OutputMessage: "output_message",
    EasyMessage: "easy_message",
    InputMessage: "input_message",
    FunctionCall: "function_call",
    FunctionCallOutput: "function_call_output",
    FunctionCallOutputItem: "function_call_output_item",
    ReasoningItem: "reasoning",
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


#: the ``type`` of every tool the OpenAI SDK's ``ToolParam`` union has (openai 2.44.0)
TOOL_TYPES = frozenset(
    {
        "function",
        "file_search",
        "computer",
        "computer_use_preview",
        "web_search",
        "web_search_2025_08_26",
        "mcp",
        "code_interpreter",
        "image_generation",
        "local_shell",
        "shell",
        "custom",
        "namespace",
        "tool_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "apply_patch",
    }
)


def _function_tool_param(value: Any) -> Any:
    """A tool is an object of a type the SDK knows (refused otherwise); a function tool has the SDK's
    required keys and keeps its declared key order. Other tools are passed on as given."""
    order = ("name", "parameters", "strict", "type", "defer_loading", "description")
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    if value.get("type") not in TOOL_TYPES:
        raise PydanticCustomError("tool_type", "a tool's type must be one the OpenAI SDK knows")
    if value.get("type") != "function":
        return value
    for key, kinds, text in (
        ("name", (str,), "a string"),
        ("parameters", (dict, type(None)), "an object or null"),
        ("strict", (bool, type(None)), "a boolean or null"),
    ):
        if key not in value:
            raise PydanticCustomError("missing", "a function tool needs {key}", {"key": key})
        if not isinstance(value[key], kinds):
            raise PydanticCustomError(
                "function_tool_type", "a function tool's {key} must be {kind}", {"key": key, "kind": text}
            )
    if set(value) <= set(order):
        return {k: value[k] for k in order if k in value}
    return value


def _tool_choice_param(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "function" and set(value) == {"name", "type"}:
        return {"name": value["name"], "type": "function"}
    return value


class ReasoningConfig(_Open):
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
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
        for item in map(_base_item, self.output):
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
        for item in map(_base_item, self.output):
            if isinstance(item, EasyMessage) and isinstance(item.content, str):
                parts.append(item.content)
            elif isinstance(item, OutputMessage):
                parts.extend(p.text for p in item.content if isinstance(p, OutputText))
            elif isinstance(item, (EasyMessage, InputMessage)) and item.content:
                raise UnreadableOutput("'dict' object has no attribute 'type'")
        return "".join(parts)


def _base_item(item: Any) -> Any:
    """A training variant (kept as given, with its token ids) read as the item it extends, as NeMo Gym's
    ``…ForTraining`` classes are subclasses of the items they extend."""
    if isinstance(item, dict) and set(item) >= _TOKEN_FIELDS:
        try:
            return _OUTPUT_ITEM.validate_python(
                {k: v for k, v in item.items() if k not in _TOKEN_FIELDS | {"routed_experts"}}
            )
        except ValidationError:
            return item
    return item


class UnreadableOutput(AttributeError):
    """The reference server fails reading this response's text (an ``AttributeError`` there, too)."""


# --- the verify answer ------------------------------------------------------------------------


class VerifyResponse(BaseModel):
    """What every ``/verify`` answer starts with: the request's two objects echoed, then the verdict.

    A server's own verdict fields follow these (subclass it and declare them in NeMo Gym's order);
    the rollout id a request may carry (``_ng_rollout_id``) is read, never echoed.
    """

    responses_create_params: CreateParams
    response: ResponseObject
    reward: float
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None


# --- forms ------------------------------------------------------------------------------------

_REQUIRED = object()
Fields = tuple[tuple[str, Any], ...]
Nested = Mapping[str, Callable[[Any, bool], Any]]


def _fields(model: type[BaseModel]) -> Fields:
    """A model's fields in declaration order with their defaults (``_REQUIRED`` when none)."""
    return tuple(
        (name, _REQUIRED if info.is_required() else info.get_default(call_default_factory=True))
        for name, info in model.model_fields.items()
    )


def _fill(value: Any, fields: Fields, full: bool, *, nested: Nested | None = None, keep_extra: bool) -> Any:
    """Lenient form of ``value``: ``fields`` in their order (defaults filled when ``full``), nested values formed."""
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    for name, default in fields:
        if name in value:
            field = value[name]
            if nested and name in nested and field is not None:
                field = nested[name](field, full)
            out[name] = field
        elif full and default is not _REQUIRED:
            out[name] = list(default) if isinstance(default, list) else default
    if keep_extra:
        known = {name for name, _ in fields}
        out.update({k: v for k, v in value.items() if k not in known})
    return out


def _each(form: Callable[[Any, bool], Any]) -> Callable[[Any, bool], Any]:
    return lambda values, full: [form(v, full) for v in values] if isinstance(values, list) else values


def _lenient(model: type[BaseModel], nested: Nested | None = None) -> Callable[[Any, bool], Any]:
    fields = _fields(model)
    keep_extra = model.model_config.get("extra") in ("allow", "forbid")
    return lambda value, full: _fill(value, fields, full, nested=nested, keep_extra=keep_extra)


def _output_part(part: Any, full: bool) -> Any:
    if isinstance(part, Mapping) and (part.get("type") == "refusal" or ("refusal" in part and "type" not in part)):
        return _LENIENT_REFUSAL(part, full)
    return _LENIENT_OUTPUT_TEXT(part, full)


_LENIENT_OUTPUT_TEXT = _lenient(OutputText)
_LENIENT_REFUSAL = _lenient(Refusal)
_LENIENT_REASONING_CONFIG = _lenient(ReasoningConfig)
_LENIENT_ITEMS: dict[str, Callable[[Any, bool], Any]] = {
    "easy_message": _lenient(EasyMessage),
    "input_message": _lenient(InputMessage),
    "output_message": _lenient(OutputMessage, {"content": _each(_output_part)}),
    "function_call": _lenient(FunctionCall),
    "function_call_output": _lenient(FunctionCallOutput),
    "reasoning": _lenient(
        ReasoningItem, {"summary": _each(_lenient(SummaryText)), "content": _each(_lenient(ReasoningText))}
    ),
}


def _lenient_kind(value: Mapping[str, Any], output: bool) -> str:
    """The kind of an item the models refused. An output item without ``type`` is one an agent built
    itself (an observation as a user message, a function's result): told apart like an input item."""
    try:
        kind = _item_kind(dict(value), output=output and "type" in value)
    except PydanticCustomError:
        return "other"
    return kind


def _lenient_item(value: Any, full: bool, output: bool) -> Any:
    if not isinstance(value, Mapping):
        return value
    form = _LENIENT_ITEMS.get(_lenient_kind(value, output))
    return dict(value) if form is None else form(value, full)


def _lenient_tool(value: Any, full: bool) -> Any:
    if isinstance(value, Mapping) and value.get("type") == "function":
        return _lenient(FunctionTool)(value, full)
    return value


def _created_at(value: Any, full: bool) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


_LENIENT_CREATE_PARAMS = _lenient(
    CreateParams,
    {
        "input": lambda v, full: [_lenient_item(i, full, False) for i in v] if isinstance(v, list) else v,
        "reasoning": _LENIENT_REASONING_CONFIG,
    },
)
_LENIENT_RESPONSE = _lenient(
    ResponseObject,
    {
        "created_at": _created_at,
        "error": _lenient(ResponseErrorObject),
        "incomplete_details": _lenient(IncompleteDetails),
        "output": lambda v, full: [_lenient_item(i, full, True) for i in v] if isinstance(v, list) else v,
        "tools": _each(_lenient_tool),
        "reasoning": _LENIENT_REASONING_CONFIG,
        "text": _lenient(TextConfig),
        "usage": _lenient(Usage),
    },
)
_OUTPUT_ITEM: TypeAdapter[Any] = TypeAdapter(OutputItem)
_INPUT_ITEM: TypeAdapter[Any] = TypeAdapter(InputItem)


def _canonical(adapter: Any, value: Any, full: bool) -> Any:
    """``value`` validated and serialised as NeMo Gym does; raises ``ValidationError`` where it refuses."""
    parsed = adapter.validate_python(value)
    return adapter.dump_python(parsed, mode="json", exclude_unset=not full)


def _lifted(value: dict[str, Any]) -> tuple[dict[str, Any], dict[str, TokenArray]]:
    """An item with its token arrays as empty lists, and the arrays by field."""
    arrays = {name: value[name] for name in _TOKEN_FIELDS if isinstance(value.get(name), TokenArray)}
    return ({**value, **{name: [] for name in arrays}} if arrays else value), arrays


def _keeping_arrays(form: Callable[[dict[str, Any]], Any], value: dict[str, Any], key: str | None) -> Any:
    """``form(value)`` with the token arrays of ``value`` (or of each item of its list ``key``) left as they are.

    An episode holds its calls' token fields as :class:`~gym_services.base.token_arrays.TokenArray` s; validated and
    dumped they would become lists of Python ints (a long context's prompt: tens of thousands, 36 bytes each, for
    every item that carries it). They are validated and written as empty lists in their places and put back; each
    stands for the list it equals, and is written as that list. Items that do not come out one for one (a form that
    dropped one) are made the plain way."""
    if key is None:
        plain, arrays = _lifted(value)
        taken = [arrays]
    else:
        listed = value.get(key)
        if not isinstance(listed, list):
            return form(value)
        pairs = [_lifted(dict(v)) if isinstance(v, Mapping) else (v, {}) for v in listed]
        taken = [arrays for _, arrays in pairs]
        plain = {**value, key: [v for v, _ in pairs]}
    if not any(taken):
        return form(value)
    out = form(plain)
    written = [out] if key is None else out.get(key) if isinstance(out, dict) else None
    if not (
        isinstance(written, list)
        and len(written) == len(taken)
        and all(isinstance(w, dict) and w.keys() >= a.keys() for w, a in zip(written, taken, strict=True))
    ):
        return form(value)
    for w, arrays in zip(written, taken, strict=True):
        w.update(arrays)
    return out


def _form(adapter: Any, lenient: Callable[[Any, bool], Any], full: bool) -> Callable[[dict[str, Any]], Any]:
    """A value's form as NeMo Gym writes it (:func:`_canonical`), or ``lenient``'s where its models refuse it."""

    def form(value: dict[str, Any]) -> Any:
        try:
            return _canonical(adapter, value, full)
        except ValidationError:
            return lenient(value, full)

    return form


def item(value: Any, full: bool = True, *, output: bool = False) -> Any:
    """An input item (or, with ``output``, a response output item) in the full or the given form."""
    if not isinstance(value, Mapping):
        return value
    adapter = _OUTPUT_ITEM if output else _INPUT_ITEM
    return _keeping_arrays(_form(adapter, lambda v, f: _lenient_item(v, f, output), full), dict(value), None)


def items(values: Any, full: bool = True, *, output: bool = False) -> Any:
    if not isinstance(values, list):
        return values
    return [item(v, full, output=output) for v in values]


_CREATE_PARAMS: TypeAdapter[CreateParams] = TypeAdapter(CreateParams)
_RESPONSE: TypeAdapter[ResponseObject] = TypeAdapter(ResponseObject)


def create_params(value: Any, full: bool = True) -> Any:
    """Task create params (``responses_create_params``) in the full or the given form."""
    if not isinstance(value, Mapping):
        return value
    return _keeping_arrays(_form(_CREATE_PARAMS, _LENIENT_CREATE_PARAMS, full), dict(value), "input")


def response(value: Any, full: bool = True) -> Any:
    """A Responses API response object in the full (or the given) form."""
    if not isinstance(value, Mapping):
        return value
    return _keeping_arrays(_form(_RESPONSE, _LENIENT_RESPONSE, full), dict(value), "output")


#: fields of a /run row NeMo Gym's agents do not pass on (the rollout id is read, then dropped)
DROPPED_ROW_FIELDS = ("_ng_rollout_id",)
_VERDICT = tuple(
    (name, default) for name, default in _fields(VerifyResponse) if name not in ("responses_create_params", "response")
)


def run_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A /run row as NeMo Gym's agents pass it on (``/seed_session``, ``/verify``, ``/reset``, ``/step``)."""
    out = {"responses_create_params": create_params(row.get("responses_create_params") or {"input": []})}
    out.update({k: v for k, v in row.items() if k != "responses_create_params" and k not in DROPPED_ROW_FIELDS})
    return out


def verify_answer(answer: Mapping[str, Any]) -> dict[str, Any]:
    """A verify answer in the form NeMo Gym's agents return it from ``/run``."""
    out: dict[str, Any] = {}
    if "responses_create_params" in answer:
        out["responses_create_params"] = create_params(answer["responses_create_params"])
    if "response" in answer:
        out["response"] = response(answer["response"])
    out.update(_fill(answer, _VERDICT, True, keep_extra=False))
    known = {"responses_create_params", "response", *(name for name, _ in _VERDICT), *DROPPED_ROW_FIELDS}
    out.update({k: v for k, v in answer.items() if k not in known})
    return out
