"""The tool registry: nine domains' handlers under one name space, and how a call runs.

Every tool can be called in every session (a task's ``tools`` decide which ones the model is
offered; the server does not), as in NeMo Gym's server. A call never fails at the HTTP level once
the session is known: an unknown tool, bad arguments or a handler error come back as text for the
model. Non-text results are ``json.dumps``-ed as stored (key order kept), so a restored session
answers byte for byte as the original would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gym_services.base.nemo_http import call_error_text
from gym_services.resources.indirect_prompt_injection.state import Session, active
from gym_services.resources.indirect_prompt_injection.tools import (
    common,
    ecommerce,
    education,
    healthcare,
    hr,
    insurance,
    it_helpdesk,
    legal,
    logistics,
    real_estate,
)
from gym_services.resources.indirect_prompt_injection.tools.common import Handler

MODULES = {
    "healthcare": healthcare,
    "hr": hr,
    "ecommerce": ecommerce,
    "education": education,
    "insurance": insurance,
    "it_helpdesk": it_helpdesk,
    "legal": legal,
    "logistics": logistics,
    "real_estate": real_estate,
}

#: domain -> the tools its tasks offer (its own and the shared messaging tools it uses).
DOMAINS: dict[str, dict[str, Handler]] = {
    domain: {**module.TOOLS, **{name: common.TOOLS[name] for name in module.SHARED}}
    for domain, module in MODULES.items()
}

#: tool name -> handler, across domains.
TOOLS: dict[str, Handler] = {name: handler for tools in DOMAINS.values() for name, handler in tools.items()}


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the model sees
    outcome: Literal["ok", "error", "unknown_tool"]


def run_tool(session: Session, name: str, args: Mapping[str, Any]) -> ToolResult:
    """Run one tool call against the session's environment (``null`` arguments count as absent)."""
    handler = TOOLS.get(name)
    if handler is None:
        return ToolResult(f"Unknown tool: {name}", "unknown_tool")
    kwargs = {key: value for key, value in args.items() if value is not None}
    try:
        with active(session):
            result = handler(session.environment, **kwargs)
        return ToolResult(result if isinstance(result, str) else json.dumps(result), "ok")
    except Exception as exc:
        return ToolResult(
            f"Error executing tool '{name}' ({type(exc).__name__}): {call_error_text(exc, handler)}", "error"
        )


__all__ = ["DOMAINS", "MODULES", "TOOLS", "ToolResult", "run_tool"]
