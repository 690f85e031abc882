"""Responses API objects in the form NeMo Gym's agents exchange them (the typed models' serialised form).

NeMo Gym's agents parse every task row, model response and output item into typed models and
serialise them again. Two forms result, and our agents produce both so that models, resources
servers and callers see the same JSON from either agent:

- the *full* form (:func:`create_params`, :func:`response`, :func:`item`): every field of the
  model, defaults filled in (``null``, ``"auto"``, ``[]`` ...), as in ``/seed_session``,
  ``/verify``, ``/reset``, ``/step`` bodies and ``/run`` answers;
- the *given* form (``full=False``): only the fields the producer set, unknown fields of items that
  do not keep them dropped, as in the model's ``input`` items.

Items are classified as NeMo Gym classifies them (a message by role, content and status; an item
without ``type`` by its fields). Item kinds that our agents never create or see in practice (MCP,
computer use, web search ...) are passed through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

_REQUIRED = object()
_STATUSES = frozenset({"in_progress", "completed", "incomplete"})
_SIMPLE_ROLES = frozenset({"user", "system", "developer"})
_OUTPUT_PARTS = frozenset({"output_text", "refusal"})

Fields = tuple[tuple[str, Any], ...]
Nested = Mapping[str, Callable[[Any, bool], Any]]


def _fill(value: Any, fields: Fields, full: bool, *, nested: Nested | None = None, keep_extra: bool) -> Any:
    """``value`` with ``fields`` in their order (defaults filled when ``full``), nested values formed."""
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


# --- parts ------------------------------------------------------------------------------------

_OUTPUT_TEXT: Fields = (("annotations", _REQUIRED), ("text", _REQUIRED), ("type", "output_text"), ("logprobs", None))
_REFUSAL: Fields = (("refusal", _REQUIRED), ("type", "refusal"))
_SUMMARY: Fields = (("text", _REQUIRED), ("type", "summary_text"))
_REASONING_TEXT: Fields = (("text", _REQUIRED), ("type", "reasoning_text"))


def _output_part(part: Any, full: bool) -> Any:
    if isinstance(part, Mapping) and (part.get("type") == "refusal" or ("refusal" in part and "type" not in part)):
        return _fill(part, _REFUSAL, full, keep_extra=False)
    return _fill(part, _OUTPUT_TEXT, full, keep_extra=False)


# --- items ------------------------------------------------------------------------------------

_EASY_MESSAGE: Fields = (("content", _REQUIRED), ("role", _REQUIRED), ("type", "message"), ("phase", None))
_INPUT_MESSAGE: Fields = (("content", _REQUIRED), ("role", _REQUIRED), ("status", "completed"), ("type", "message"))
_OUTPUT_MESSAGE: Fields = (
    ("id", _REQUIRED),
    ("content", _REQUIRED),
    ("role", "assistant"),
    ("status", "completed"),
    ("type", "message"),
    ("phase", None),
)
_FUNCTION_CALL: Fields = (
    ("arguments", _REQUIRED),
    ("call_id", _REQUIRED),
    ("name", _REQUIRED),
    ("type", "function_call"),
    ("id", None),
    ("status", None),
    ("namespace", None),
)
_FUNCTION_CALL_OUTPUT: Fields = (
    ("call_id", _REQUIRED),
    ("output", _REQUIRED),
    ("type", "function_call_output"),
    ("id", None),
    ("status", None),
)
_REASONING: Fields = (
    ("id", _REQUIRED),
    ("summary", _REQUIRED),
    ("type", "reasoning"),
    ("encrypted_content", None),
    ("content", None),
)


def _first_part_type(content: Any) -> str | None:
    if not isinstance(content, list) or not content:
        return None
    first = content[0]
    if isinstance(first, Mapping):
        return first.get("type") or ("refusal" if "refusal" in first else None)
    return None


def message_kind(item: Mapping[str, Any]) -> str:
    """``easy``, ``input`` or ``output``: which kind of message an item is."""
    content = item.get("content")
    if item.get("role") in _SIMPLE_ROLES:
        return "input" if isinstance(content, list) and item.get("status") in _STATUSES else "easy"
    if isinstance(content, list):
        if content and _first_part_type(content) in _OUTPUT_PARTS:
            return "output"
        if not content and isinstance(item.get("id"), str):
            return "output"
    return "easy"


def item_kind(item: Mapping[str, Any], *, output: bool = False) -> str | None:
    """The kind of an input (or, with ``output``, a response output) item; ``None`` for kinds passed through."""
    kind = item.get("type")
    if kind == "message":
        return message_kind(item)
    if kind == "function_call_output":
        if output and isinstance(item.get("id"), str) and item.get("status") in _STATUSES:
            return None  # the provider's own output item: passed through
        return "function_call_output"
    if kind in ("function_call", "reasoning"):
        return kind
    if kind is not None:
        return None
    # an item without a type (an agent's own prompt message or function result), recognised by its fields
    role, content = item.get("role"), item.get("content")
    if role in _SIMPLE_ROLES | {"assistant"} and isinstance(content, (str, list)):
        found = message_kind(item)
        if found == "output":
            return found if isinstance(item.get("id"), str) else None
        return found if _first_part_type(content) not in _OUTPUT_PARTS else None
    if "role" not in item and isinstance(item.get("id"), str) and isinstance(content, list):
        if not content or _first_part_type(content) in _OUTPUT_PARTS:
            return "output"
    if "arguments" in item and "name" in item:
        return "function_call" if "call_id" in item else None
    if isinstance(item.get("call_id"), str) and "output" in item:
        return "function_call_output"
    if isinstance(item.get("id"), str) and isinstance(item.get("summary"), list):
        return "reasoning"
    return None


_ITEM_FORMS: dict[str, tuple[Fields, Nested | None]] = {
    "easy": (_EASY_MESSAGE, None),
    "input": (_INPUT_MESSAGE, None),
    "output": (_OUTPUT_MESSAGE, {"content": _each(_output_part)}),
    "function_call": (_FUNCTION_CALL, None),
    "function_call_output": (_FUNCTION_CALL_OUTPUT, None),
    "reasoning": (
        _REASONING,
        {
            "summary": _each(lambda p, full: _fill(p, _SUMMARY, full, keep_extra=True)),
            "content": _each(lambda p, full: _fill(p, _REASONING_TEXT, full, keep_extra=True)),
        },
    ),
}


def item(value: Any, full: bool = True, *, output: bool = False) -> Any:
    """An input item (or a response output item, with ``output``) in the full or the given form."""
    if not isinstance(value, Mapping):
        return value
    kind = item_kind(value, output=output)
    if kind is None:
        return dict(value)
    fields, nested = _ITEM_FORMS[kind]
    return _fill(value, fields, full, nested=nested, keep_extra=False)


def items(values: Any, full: bool = True, *, output: bool = False) -> Any:
    if not isinstance(values, list):
        return values
    return [item(v, full, output=output) for v in values]


# --- create params ----------------------------------------------------------------------------

_REASONING_CONFIG: Fields = (("context", None), ("effort", None), ("generate_summary", None), ("summary", None))

CREATE_PARAMS: Fields = (
    ("background", None),
    ("include", None),
    ("input", _REQUIRED),
    ("instructions", None),
    ("max_output_tokens", None),
    ("max_tool_calls", None),
    ("metadata", None),
    ("model", None),
    ("parallel_tool_calls", True),
    ("previous_response_id", None),
    ("prompt", None),
    ("reasoning", None),
    ("service_tier", None),
    ("store", None),
    ("context_management", None),
    ("conversation", None),
    ("moderation", None),
    ("prompt_cache_key", None),
    ("prompt_cache_retention", None),
    ("safety_identifier", None),
    ("stream_options", None),
    ("temperature", None),
    ("text", None),
    ("tool_choice", "auto"),
    ("tools", []),
    ("top_logprobs", None),
    ("top_p", None),
    ("truncation", None),
    ("user", None),
    ("stream", None),
)


def create_params(value: Any, full: bool = True) -> Any:
    """Task create params (``responses_create_params``) in the full or the given form."""
    return _fill(
        value,
        CREATE_PARAMS,
        full,
        nested={
            "input": lambda v, f: items(v, f),
            "reasoning": lambda v, f: _fill(v, _REASONING_CONFIG, f, keep_extra=True),
        },
        keep_extra=True,
    )


# --- response ---------------------------------------------------------------------------------

_USAGE: Fields = (
    ("input_tokens", _REQUIRED),
    ("input_tokens_details", _REQUIRED),
    ("output_tokens", _REQUIRED),
    ("output_tokens_details", _REQUIRED),
    ("total_tokens", _REQUIRED),
)
_FUNCTION_TOOL: Fields = (
    ("name", _REQUIRED),
    ("parameters", None),
    ("strict", None),
    ("type", "function"),
    ("defer_loading", None),
    ("description", None),
)


def _tool(value: Any, full: bool) -> Any:
    if isinstance(value, Mapping) and value.get("type") == "function":
        return _fill(value, _FUNCTION_TOOL, full, keep_extra=True)
    return value


def _created_at(value: Any, full: bool) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


RESPONSE: Fields = (
    ("id", _REQUIRED),
    ("created_at", _REQUIRED),
    ("error", None),
    ("incomplete_details", None),
    ("instructions", None),
    ("metadata", None),
    ("model", _REQUIRED),
    ("object", "response"),
    ("output", _REQUIRED),
    ("parallel_tool_calls", _REQUIRED),
    ("temperature", None),
    ("tool_choice", _REQUIRED),
    ("tools", _REQUIRED),
    ("top_p", None),
    ("background", None),
    ("completed_at", None),
    ("conversation", None),
    ("max_output_tokens", None),
    ("max_tool_calls", None),
    ("moderation", None),
    ("previous_response_id", None),
    ("prompt", None),
    ("prompt_cache_key", None),
    ("prompt_cache_retention", None),
    ("reasoning", None),
    ("safety_identifier", None),
    ("service_tier", None),
    ("status", None),
    ("text", None),
    ("top_logprobs", None),
    ("truncation", None),
    ("usage", None),
    ("user", None),
)


def response(value: Any, full: bool = True) -> Any:
    """A Responses API response object in the full form (as NeMo Gym's agents answer and verify it)."""
    return _fill(
        value,
        RESPONSE,
        full,
        nested={
            "created_at": _created_at,
            "error": lambda v, f: _fill(v, (("code", _REQUIRED), ("message", _REQUIRED)), f, keep_extra=True),
            "incomplete_details": lambda v, f: _fill(v, (("reason", None),), f, keep_extra=True),
            "output": lambda v, f: items(v, f, output=True),
            "tools": _each(_tool),
            "reasoning": lambda v, f: _fill(v, _REASONING_CONFIG, f, keep_extra=True),
            "usage": lambda v, f: _fill(v, _USAGE, f, keep_extra=True),
            "conversation": lambda v, f: _fill(v, (("id", _REQUIRED),), f, keep_extra=True),
        },
        keep_extra=True,
    )


# --- the bodies around them -------------------------------------------------------------------

#: fields of a /run row NeMo Gym's agents do not pass on (the rollout id is read, then dropped)
DROPPED_ROW_FIELDS = ("_ng_rollout_id",)
VERIFY_RESPONSE: Fields = (("reward", _REQUIRED), ("mask_sample", False), ("failure_kind", None), ("failure_reason", None))


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
    out.update(_fill(answer, VERIFY_RESPONSE, True, keep_extra=False))
    known = {"responses_create_params", "response", *(name for name, _ in VERIFY_RESPONSE), *DROPPED_ROW_FIELDS}
    out.update({k: v for k, v in answer.items() if k not in known})
    return out
