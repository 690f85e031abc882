"""The text form of tool calls inside a generation: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

A generation is one string. Tool calls are written into it with this markup (the Hermes/Qwen
convention), so a generation cut at *any* token boundary — even inside a tool call — is a plain
prefix of one string, continued from its token ids. Both the built-in inference worker
(which emits the markup) and the policy model (which cuts, continues and converts to Responses
output items) read it with :func:`parse`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """A complete tool call; ``arguments`` is a JSON object encoded as a string (the OpenAI form)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Parsed:
    """A generation split into its visible text and its complete tool calls."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


def encode_arguments(arguments: Mapping[str, Any] | str) -> str:
    """Arguments as the JSON string a tool call carries (a string is taken as already encoded)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(dict(arguments), ensure_ascii=False)


def render(name: str, arguments: Mapping[str, Any] | str) -> str:
    """One tool call in markup form; string arguments that hold a JSON object are embedded as that object."""
    args: Any = arguments
    if isinstance(arguments, str):
        try:
            args = json.loads(arguments)
        except json.JSONDecodeError:
            args = arguments
    return OPEN + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + CLOSE


def _call_from(body: str) -> ToolCall | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", {})
    if isinstance(arguments, dict):
        return ToolCall(data["name"], encode_arguments(arguments))
    if isinstance(arguments, str):
        return ToolCall(data["name"], arguments)
    return None


def parse(text: str) -> Parsed:
    """Split ``text`` into content and complete tool calls.

    Markup that is unfinished (no closing tag, e.g. a generation stopped by ``max_tokens``) or not
    valid JSON stays in the content as text, so nothing the model wrote is lost. When at least one
    tool call was found, the content is stripped of the whitespace around the calls.
    """
    content: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            content.append(text[pos:])
            break
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            content.append(text[pos:])
            break
        call = _call_from(text[start + len(OPEN) : end])
        if call is None:
            content.append(text[pos : end + len(CLOSE)])
        else:
            content.append(text[pos:start])
            calls.append(call)
        pos = end + len(CLOSE)
    joined = "".join(content)
    return Parsed(joined.strip() if calls else joined, calls)
