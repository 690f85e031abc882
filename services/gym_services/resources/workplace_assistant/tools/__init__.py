"""The 27 Workplace Assistant tools and the dispatcher the tool route uses.

``call_tool`` never raises for a bad call: like the real server, every failure (unknown tool,
arguments that do not fit the tool's JSON schema, a tool rejecting its input) comes back as the
model-visible text ``Error executing tool '<name>': ...``. ``None`` arguments are dropped first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..environment import DATA_DIR, WorkplaceEnvironment
from . import (
    analytics,
    calendar,
    company_directory,
    customer_relationship_manager,
    email,
    project_management,
)

#: Toolkit module per tool-definition file in ``data/tools``.
TOOLKITS = {
    "company_directory": company_directory,
    "email": email,
    "calendar": calendar,
    "analytics": analytics,
    "project_management": project_management,
    "customer_relationship_manager": customer_relationship_manager,
}

ToolFunction = Callable[..., object]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    toolkit: str
    function: ToolFunction
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
    for toolkit, module in TOOLKITS.items():
        definition = json.loads((DATA_DIR / "tools" / f"{toolkit}.json").read_text())
        implemented: dict[str, ToolFunction] = module.TOOLS
        declared = {tool["name"] for tool in definition["tools"]}
        if declared != set(implemented):
            raise RuntimeError(f"{toolkit}: definitions {declared} != implemented {set(implemented)}")
        for tool in definition["tools"]:
            props = tool["parameters"]["properties"]
            specs[tool["name"]] = ToolSpec(
                name=tool["name"],
                toolkit=toolkit,
                function=implemented[tool["name"]],
                operation_type=tool["operation_type"],
                parameters={p: spec["type"] for p, spec in props.items()},
                schema={k: tool[k] for k in ("type", "name", "description", "parameters", "strict")},
            )
    return specs


def tool_schemas() -> list[dict[str, Any]]:
    """Tool definitions in the Responses API ``tools`` shape, in toolkit order."""
    return [spec.schema for spec in tool_specs().values()]


_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float)}


def _check_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> str | None:
    for key, value in arguments.items():
        expected = spec.parameters.get(key)
        if expected is None:
            return f"unexpected argument '{key}'"
        if isinstance(value, bool) or not isinstance(value, _JSON_TYPES[expected]):
            return f"argument '{key}' must be of type {expected}, got {type(value).__name__}"
    return None


def error_text(name: str, message: str) -> str:
    return f"Error executing tool '{name}': {message}"


def call_tool(env: WorkplaceEnvironment, name: str, arguments: Mapping[str, Any] | str | None) -> object:
    """Run one tool call on ``env``; returns the tool's output (a string or a JSON-able value)."""
    spec = tool_specs().get(name)
    if spec is None:
        return error_text(name, f"unknown tool '{name}'")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return error_text(name, f"arguments are not valid JSON: {exc.msg}")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return error_text(name, "arguments must be a JSON object")
    kwargs = {k: v for k, v in arguments.items() if v is not None}
    problem = _check_arguments(spec, kwargs)
    if problem:
        return error_text(name, problem)
    try:
        return spec.function(env, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every tool failure is model-visible text
        return error_text(name, str(exc) or type(exc).__name__)


__all__ = ["ToolSpec", "call_tool", "error_text", "tool_schemas", "tool_specs"]
