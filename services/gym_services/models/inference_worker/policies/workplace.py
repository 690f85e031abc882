"""``workplace-oracle``: solves the shipped Workplace Assistant tasks from their ground truth.

The task is found by its user prompt in the vendored ``example.jsonl``. With ``k`` tool results
already in the conversation the policy emits ground-truth action ``k`` (one call per turn, as the
tasks set ``parallel_tool_calls: false``); once every action has a result it answers in text.
"""

from __future__ import annotations

import contextlib
import json
from functools import cached_property
from typing import Any

from gym_services.models.inference_worker.policies.base import (
    Conversation,
    Policy,
    input_texts,
    load_tasks,
    tool_call,
)


def ground_truth_actions(task: dict[str, Any]) -> list[tuple[str, dict[str, Any] | str]]:
    """The task's ground truth as (tool name, arguments) pairs; a string ground truth has no actions."""
    truth = task.get("ground_truth")
    if not isinstance(truth, list):
        return []
    actions = []
    for step in truth:
        arguments = step.get("arguments", {})
        if isinstance(arguments, str):
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        actions.append((step["name"], arguments))
    return actions


class WorkplaceOracle(Policy):
    name = "workplace-oracle"
    description = "emits the ground-truth tool calls of the shipped Workplace Assistant tasks, then answers"

    @cached_property
    def tasks_by_prompt(self) -> dict[str, dict[str, Any]]:
        index: dict[str, dict[str, Any]] = {}
        for task in load_tasks("workplace_assistant"):
            for prompt in input_texts(task, "user")[:1]:
                index.setdefault(prompt, task)
        return index

    def respond(self, conversation: Conversation) -> str:
        prompt = conversation.first("user")
        task = self.tasks_by_prompt.get(prompt or "")
        if task is None:
            return "I could not find this request among the workplace tasks I know, so I will not take any action."
        actions = ground_truth_actions(task)
        done = conversation.count("tool")
        if done < len(actions):
            name, arguments = actions[done]
            return f"Action {done + 1} of {len(actions)}: I will call {name}.\n" + tool_call(name, arguments)
        truth = task.get("ground_truth")
        if isinstance(truth, str):
            return truth
        names = ", ".join(name for name, _ in actions)
        plural = "" if len(actions) == 1 else "s"
        return f"Done. I completed {len(actions)} action{plural} for this request: {names}."
