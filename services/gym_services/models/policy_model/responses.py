"""The Responses API subset Gym agents use, and its conversion to and from chat completions.

Request: ``input`` (a string, or items: ``message``, ``function_call``, ``function_call_output``;
``reasoning`` items are skipped), ``instructions``, ``tools`` (function tools), ``tool_choice``,
``parallel_tool_calls``, ``max_output_tokens``, ``temperature``, ``top_p``, ``model``.
Response: ``output`` items ``message`` (one ``output_text`` part) and ``function_call``, ``usage``,
``status`` and ``incomplete_details``. Every id is derived from the request digest, so the response
to a request is the same whether its generation ran in one go, was cut and resumed, or was continued
from a prefix restored by a fresh process.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gym_services.base import id_json
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.tokens import Tokens
from gym_services.models import tool_markup


class ResponsesRequest(BaseModel):
    """Fields the agents send that we do not use (metadata, store, include, ...) are accepted."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None


def request_digest(request: ResponsesRequest) -> str:
    """sha256 of the canonical request: the same generation re-issued from a boundary has the same digest."""
    semantic = request.model_dump(mode="json", exclude_none=True, exclude={"stream"})
    return hashlib.sha256(id_json.dumps(semantic, "input", sort_keys=True)).hexdigest()  # canonical_json's bytes


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "refusal":
                parts.append(str(part.get("refusal", "")))
        return "".join(parts)
    raise ApiError(
        ErrorCode.BAD_REQUEST, f"message content must be a string or a list of parts, got {type(content).__name__}"
    )


def _required(item: dict[str, Any], key: str, index: int) -> Any:
    if key not in item:
        raise ApiError(ErrorCode.BAD_REQUEST, f"input[{index}] ({item.get('type')}) needs {key!r}")
    return item[key]


def chat_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """Responses ``instructions`` + ``input`` as chat messages; a turn's text and calls share one assistant message."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    for index, item in enumerate(request.input):
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = _required(item, "role", index)
            if role not in ("system", "developer", "user", "assistant"):
                raise ApiError(ErrorCode.BAD_REQUEST, f"input[{index}] has unknown role {role!r}")
            messages.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"))})
        elif kind == "function_call":
            arguments = _required(item, "arguments", index)
            call = {
                "id": _required(item, "call_id", index),
                "type": "function",
                "function": {
                    "name": _required(item, "name", index),
                    "arguments": tool_markup.encode_arguments(arguments),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _required(item, "output", index)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _required(item, "call_id", index),
                    "content": output if isinstance(output, str) else json.dumps(output, ensure_ascii=False),
                }
            )
        elif kind == "reasoning":
            continue
        else:
            raise ApiError(ErrorCode.BAD_REQUEST, f"input[{index}] has unsupported type {kind!r}")
    return messages


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for tool in tools:
        if tool.get("type", "function") != "function":
            raise ApiError(ErrorCode.BAD_REQUEST, f"only function tools are supported, got {tool.get('type')!r}")
        if isinstance(tool.get("function"), dict):
            out.append({"type": "function", "function": tool["function"]})
            continue
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        if "name" not in function:
            raise ApiError(ErrorCode.BAD_REQUEST, "a function tool needs a name")
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def chat_body(request: ResponsesRequest, model: str) -> dict[str, Any]:
    """The upstream chat completions request (without streaming settings or continuation)."""
    body: dict[str, Any] = {"model": model, "messages": chat_messages(request)}
    tools = chat_tools(request.tools)
    if tools:
        body["tools"] = tools
    optional = {
        "tool_choice": chat_tool_choice(request.tool_choice),
        "parallel_tool_calls": request.parallel_tool_calls,
        "temperature": request.temperature,
        "top_p": request.top_p,
        # not a Responses API field: a sampling seed passed through to the engine (vLLM's per-request seed)
        "seed": (request.model_extra or {}).get("seed"),
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def _id(prefix: str, digest: str, *parts: object) -> str:
    tail = hashlib.sha256(":".join([digest, *map(str, parts)]).encode()).hexdigest()[:24]
    return f"{prefix}_{tail}"


def _message(digest: str, text: str) -> dict[str, Any]:
    return {
        "id": _id("msg", digest, "message"),
        "type": "message",
        "role": "assistant",
        "status": "completed",  # as NeMo Gym's converter writes it; the response's status says incomplete
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def output_items(digest: str, text: str, tokens: Tokens | None) -> list[dict[str, Any]]:
    """A finished generation's output items: its message (when it has text), then its tool calls.

    ``tokens`` go on the last item as NeMo Gym's three fields (``prompt_token_ids``,
    ``generation_token_ids``, ``generation_log_probs``), which makes it NeMo Gym's ``…__training``
    variant; a generation with no output item (empty text) gets an empty assistant message to carry
    them, as NeMo Gym's converter does."""
    parsed = tool_markup.parse(text)
    output = [_message(digest, parsed.content)] if parsed.content else []
    for index, call in enumerate(parsed.tool_calls):
        output.append(
            {
                "id": _id("fc", digest, index),
                "type": "function_call",
                "call_id": _id("call", digest, index),
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    if tokens is not None:
        if not output:
            output.append(_message(digest, ""))
        output[-1].update(tokens.fields())
    return output


def build_response(
    request: ResponsesRequest,
    digest: str,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    created_at: float,
    tokens: Tokens | None = None,
) -> dict[str, Any]:
    """A Responses API object for a finished generation (its whole text, tool calls in markup form, and its
    ``tokens`` when given: :func:`output_items`)."""
    complete = finish_reason in ("stop", "tool_calls")
    output = output_items(digest, text, tokens)
    incomplete = None
    if not complete:
        incomplete = {"reason": "max_output_tokens" if finish_reason == "length" else finish_reason}
    return {
        "id": _id("resp", digest),
        "object": "response",
        "created_at": created_at,
        "status": "completed" if complete else "incomplete",
        "error": None,
        "incomplete_details": incomplete,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls if request.parallel_tool_calls is not None else True,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
        "tools": request.tools or [],
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
