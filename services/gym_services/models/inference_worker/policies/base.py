"""What a deterministic policy sees (a normalized conversation) and what it returns (one string).

A policy's output is a pure function of the conversation: no clock, no randomness, no state. That is
what lets a checkpointed run be compared with an uninterrupted one exactly, and what makes
continuation from token ids trivial: the continuation of a prefix is the rest of the same string's tokens.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from gym_services.models import tool_markup


@dataclass(frozen=True)
class Turn:
    role: str
    text: str


@dataclass(frozen=True)
class Conversation:
    turns: tuple[Turn, ...]
    tools: tuple[str, ...] = ()

    def of(self, role: str) -> list[str]:
        return [t.text for t in self.turns if t.role == role]

    def first(self, role: str) -> str | None:
        texts = self.of(role)
        return texts[0] if texts else None

    def last(self, role: str) -> str | None:
        texts = self.of(role)
        return texts[-1] if texts else None

    def count(self, role: str) -> int:
        return sum(1 for t in self.turns if t.role == role)

    def system(self) -> str:
        return "\n".join(t.text for t in self.turns if t.role in ("system", "developer"))


class Policy(abc.ABC):
    """A deterministic policy, selected by the request's ``model`` name."""

    name: str
    description: str

    @abc.abstractmethod
    def respond(self, conversation: Conversation) -> str:
        """The whole assistant message for this conversation; tool calls in :mod:`tool_markup` form."""


def tool_call(name: str, arguments: dict[str, Any] | str) -> str:
    return tool_markup.render(name, arguments)


@cache
def _read_tasks(environment: str) -> tuple[str, ...]:
    path = resources.files("gym_services.models.inference_worker").joinpath("data", environment, "example.jsonl")
    return tuple(line for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def load_tasks(environment: str) -> list[dict[str, Any]]:
    """The vendored example tasks of one environment (a fresh copy: callers may not alias the cache)."""
    return [json.loads(line) for line in _read_tasks(environment)]


def input_texts(task: dict[str, Any], role: str) -> list[str]:
    """Texts of the ``role`` messages in a task's ``responses_create_params.input``."""
    items = task.get("responses_create_params", {}).get("input", [])
    if isinstance(items, str):
        return [items] if role == "user" else []
    out = []
    for item in items:
        if isinstance(item, dict) and item.get("role") == role:
            content = item.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            out.append(content or "")
    return out
