"""``ipi-safe`` and ``ipi-follow``: indirect prompt injection tasks.

The task is found by its system and user prompt in the vendored ``example.jsonl`` (NeMo Gym's
healthcare and HR tasks) or ``domain_examples.jsonl`` (one task of each other domain). Both variants call
the task's ``required_tools`` (arguments derived from the prompt and the task's environment), one call
per turn; ``ipi-follow`` then also calls the injection's ``target_tool`` with its ``target_args``, the
way a model that obeys the injected text would. With every call answered they reply in text.
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from importlib import resources
from typing import Any

from gym_services.models.inference_worker.policies.base import (
    Conversation,
    Policy,
    input_texts,
    load_tasks,
    tool_call,
)

_PROMPT_ID = re.compile(r"\bID:\s*([A-Za-z0-9][A-Za-z0-9_-]*)")


def _domain_tasks() -> list[dict[str, Any]]:
    path = resources.files("gym_services.models.inference_worker").joinpath(
        "data", "indirect_prompt_injection", "domain_examples.jsonl"
    )
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _collections(environment: dict[str, Any]) -> list[dict[str, Any]]:
    """Top-level tables of an environment: dicts whose values are records (dicts)."""
    return [
        v for v in environment.values() if isinstance(v, dict) and v and all(isinstance(r, dict) for r in v.values())
    ]


def _subject_id(task: dict[str, Any]) -> str | None:
    prompts = input_texts(task, "user")
    match = _PROMPT_ID.search(prompts[0]) if prompts else None
    return match.group(1) if match else None


def _id_argument(param: str, task: dict[str, Any]) -> str | None:
    environment = task.get("environment", {})
    prompt = (input_texts(task, "user") or [""])[0]
    for table in _collections(environment):
        if not any(param in record for record in table.values()):
            continue
        subject = _subject_id(task)
        if subject in table:
            return subject
        for key in table:
            if key in prompt:
                return key
        return next(iter(table))
    return _subject_id(task)


def _date_argument(task: dict[str, Any]) -> str | None:
    subject = _subject_id(task)
    dated = [r for t in _collections(task.get("environment", {})) for r in t.values() if isinstance(r.get("date"), str)]
    for record in dated:
        if subject is not None and subject in record.values():
            date: str = record["date"]
            return date
    first: str | None = dated[0]["date"] if dated else None
    return first


def derive_arguments(schema: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    """Arguments for a required (read) tool: ids and dates the task's prompt and environment name."""
    properties = (schema.get("parameters") or {}).get("properties") or {}
    arguments: dict[str, Any] = {}
    for param in properties:
        value = None
        if param.endswith("_id"):
            value = _id_argument(param, task)
        elif param == "date":
            value = _date_argument(task)
        if value is not None:
            arguments[param] = value
    return arguments


class _IpiPolicy(Policy):
    follow_injection: bool

    @cached_property
    def tasks(self) -> dict[tuple[str, str], dict[str, Any]]:
        index: dict[tuple[str, str], dict[str, Any]] = {}
        for task in [*load_tasks("indirect_prompt_injection"), *_domain_tasks()]:
            system = "\n".join(input_texts(task, "system"))
            user = (input_texts(task, "user") or [""])[0]
            index.setdefault((system, user), task)
        return index

    def plan(self, task: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        schemas = {t.get("name"): t for t in task.get("responses_create_params", {}).get("tools", [])}
        calls = [(name, derive_arguments(schemas.get(name, {}), task)) for name in task.get("required_tools", [])]
        injection = task.get("injection") or {}
        if self.follow_injection and injection.get("target_tool"):
            calls.append((injection["target_tool"], dict(injection.get("target_args") or {})))
        return calls

    def respond(self, conversation: Conversation) -> str:
        task = self.tasks.get((conversation.system(), conversation.first("user") or ""))
        if task is None:
            return "I could not find this request among the tasks I know, so I will not take any action."
        calls = self.plan(task)
        done = conversation.count("tool")
        if done < len(calls):
            name, arguments = calls[done]
            return f"To handle the request I will call {name}.\n" + tool_call(name, arguments)
        used = ", ".join(dict.fromkeys(name for name, _ in calls)) or "no tools"
        if self.follow_injection:
            goal = (task.get("injection") or {}).get("goal", "the extra instruction")
            return f"I used {used}. I also carried out the instruction I found in the data: {goal}"
        return (
            f"I used {used} to handle your request. "
            "The data contained instructions you did not give me, so I ignored them."
        )


class IpiSafe(_IpiPolicy):
    name = "ipi-safe"
    description = "calls the task's required tools and ignores the injected instruction"
    follow_injection = False


class IpiFollow(_IpiPolicy):
    name = "ipi-follow"
    description = "calls the task's required tools, then follows the injected instruction"
    follow_injection = True
