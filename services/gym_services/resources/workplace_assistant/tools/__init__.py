"""The 27 Workplace Assistant tools and the dispatcher the tool route uses.

Like NeMo Gym's route, :func:`call_tool` never raises for a bad call: the arguments are passed to the
tool as they are (``null`` ones dropped) and any exception, an unknown tool or keyword included,
comes back as the model-visible text ``Error executing tool '<name>': <the exception's text>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gym_services.base.nemo_http import call_error_text

from ..environment import DATA_DIR, WorkplaceEnvironment
from . import (
    analytics,
    calendar,
    company_directory,
    customer_relationship_manager,
    email,
    project_management,
)
from ._common import Toolkit

#: Toolkit class per tool-definition file in ``data/tools``.
TOOLKITS: dict[str, type[Toolkit]] = {
    "company_directory": company_directory.CompanyDirectoryTool,
    "email": email.EmailTool,
    "calendar": calendar.CalendarTool,
    "analytics": analytics.AnalyticsTool,
    "project_management": project_management.ProjectManagementTool,
    "customer_relationship_manager": customer_relationship_manager.CustomerRelationshipManagerTool,
}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    toolkit: str
    toolkit_class: type[Toolkit]
    method: str
    operation_type: str  # "read" | "create" | "update" | "delete" (from the definition file)
    parameters: dict[str, str]  # parameter name -> JSON schema type
    schema: dict[str, Any]  # the tool definition as the model sees it

    @property
    def mutating(self) -> bool:
        return self.operation_type != "read"


@lru_cache(maxsize=1)
def tool_specs() -> dict[str, ToolSpec]:
    """Every tool, from ``data/tools/<toolkit>.json`` joined with its implementation."""
    specs: dict[str, ToolSpec] = {}
    for toolkit, cls in TOOLKITS.items():
        definition = json.loads((DATA_DIR / "tools" / f"{toolkit}.json").read_text())
        implemented = cls.TOOLS
        declared = {tool["name"] for tool in definition["tools"]}
        if declared != set(implemented):
            raise RuntimeError(f"{toolkit}: definitions {declared} != implemented {set(implemented)}")
        for tool in definition["tools"]:
            props = tool["parameters"]["properties"]
            specs[tool["name"]] = ToolSpec(
                name=tool["name"],
                toolkit=toolkit,
                toolkit_class=cls,
                method=implemented[tool["name"]],
                operation_type=tool["operation_type"],
                parameters={p: spec["type"] for p, spec in props.items()},
                schema={k: tool[k] for k in ("type", "name", "description", "parameters", "strict")},
            )
    return specs


def tool_schemas() -> list[dict[str, Any]]:
    """Tool definitions in the Responses API ``tools`` shape, in toolkit order."""
    return [spec.schema for spec in tool_specs().values()]


def error_text(name: str, message: str) -> str:
    return f"Error executing tool '{name}': {message}"


def call_tool(env: WorkplaceEnvironment, name: str, arguments: Mapping[str, Any] | str | None) -> object:
    """Run one tool call on ``env`` as the tool route does; returns the tool's output.

    ``arguments`` is the request body (a mapping) or, for convenience, a JSON text of one.
    """
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    kwargs = {k: v for k, v in (arguments or {}).items() if v is not None}
    method = None
    try:
        spec = tool_specs().get(name)
        if spec is None:
            raise KeyError(name)
        method = getattr(spec.toolkit_class(env), spec.method)
        return method(**kwargs)
    except Exception as exc:
        return error_text(name, str(exc) if method is None else call_error_text(exc, method))


def run_action(env: WorkplaceEnvironment, name: Any, kwargs: Any) -> None:
    """One replayed action as verify runs it: keyword arguments as given (``null`` ones kept);
    anything that fails, an unknown tool included, changes only what it changed before failing."""
    spec = tool_specs().get(name) if isinstance(name, str) else None
    if spec is None:
        raise KeyError(name)
    getattr(spec.toolkit_class(env), spec.method)(**kwargs)


__all__ = ["ToolSpec", "call_tool", "error_text", "run_action", "tool_schemas", "tool_specs"]
