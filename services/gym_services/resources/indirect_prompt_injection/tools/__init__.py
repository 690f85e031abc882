"""The tool registry: every domain's handlers under one name space, and how a call runs.

A call never fails at the HTTP level once the session is known: an unknown tool, bad
arguments or a handler error come back as model-visible text, as in the reference
server. Non-string results are ``json.dumps``-ed as stored (key order kept), so a
restored session answers byte for byte as the original would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gym_services.resources.indirect_prompt_injection.state import Session
from gym_services.resources.indirect_prompt_injection.tools import common, healthcare, hr
from gym_services.resources.indirect_prompt_injection.tools.common import Handler

#: domain -> its handlers (the shared messaging tools are in every domain).
DOMAINS: dict[str, dict[str, Handler]] = {
    "healthcare": {**healthcare.TOOLS, **common.TOOLS},
    "hr": dict(hr.TOOLS),
}

#: tool name -> handler, across domains (a task's tools decide which ones the model sees).
TOOLS: dict[str, Handler] = {name: handler for tools in DOMAINS.values() for name, handler in tools.items()}


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the model sees
    outcome: Literal["ok", "error", "unknown_tool"]


def run_tool(session: Session, name: str, args: Mapping[str, Any]) -> ToolResult:
    """Run one tool call against the session's environment."""
    handler = TOOLS.get(name)
    if handler is None:
        return ToolResult(f"Unknown tool: {name}", "unknown_tool")
    kwargs = {key: value for key, value in args.items() if value is not None}
    try:
        result = handler(session, **kwargs)
        return ToolResult(result if isinstance(result, str) else json.dumps(result), "ok")
    except Exception as exc:  # noqa: BLE001 - a tool error is an answer for the model, not a crash
        return ToolResult(f"Error executing tool '{name}' ({type(exc).__name__}): {exc}", "error")


__all__ = ["DOMAINS", "TOOLS", "ToolResult", "run_tool"]
