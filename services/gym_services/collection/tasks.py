"""A job's tasks: the JSONL file they are read from, and the agent each one names.

Errors name the file and the line, never what it holds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from gym_services.base.errors import ApiError, ErrorCode


def load_tasks(path: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The task objects of a JSONL file. Errors name the file and line, never what it holds."""
    tasks: list[dict[str, Any]] = []
    if not os.path.isfile(path):
        why = "no such file" if not os.path.exists(path) else "not a regular file"
        raise ApiError(ErrorCode.BAD_REQUEST, f"cannot read tasks {path}: {why}")
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ApiError(
                        ErrorCode.BAD_REQUEST, f"{path}:{number} is not JSON ({exc.msg} at column {exc.colno})"
                    ) from None
                if not isinstance(row, dict):
                    raise ApiError(ErrorCode.BAD_REQUEST, f"{path}:{number} must be a JSON object")
                tasks.append(row)
                if limit is not None and len(tasks) >= limit:
                    break
    except UnicodeDecodeError:
        raise ApiError(ErrorCode.BAD_REQUEST, f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise ApiError(
            ErrorCode.BAD_REQUEST, f"cannot read tasks {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    return tasks


def task_agent(task: dict[str, Any], default: str | None) -> str | None:
    agent, ref = task.get("agent"), task.get("agent_ref")
    if isinstance(agent, str):
        return agent
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else default


def check_agents(tasks: list[dict[str, Any]], default: str | None, known: Iterable[str]) -> None:
    """:class:`ApiError` (``400``) naming the tasks whose agent is none of ``known``."""
    names = set(known)
    unknown = [n for n, t in enumerate(tasks, 1) if task_agent(t, default) not in names]
    if unknown:  # the lines, not the names: an error never echoes what the file holds
        lines = ", ".join(str(n) for n in unknown[:10]) + (", ..." if len(unknown) > 10 else "")
        raise ApiError(
            ErrorCode.BAD_REQUEST,
            f"{len(unknown)} {'task' if len(unknown) == 1 else 'tasks'} (task {lines}) "
            f"{'names' if len(unknown) == 1 else 'name'} no agent this collection knows "
            f"(known: {', '.join(sorted(names)) or 'none'}; "
            "a task names its agent in agent or agent_ref.name)",
        )
