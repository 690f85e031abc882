"""The files of a collection job on the user's side: the tasks JSONL (checked before a job starts), the results
file (never replaced unless asked) and the reward table made from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gym_services.base.text import human_bytes, table
from gym_services.commands.stack.jobs import CollectError


def check_tasks_file(path: Path, limit: int | None = None) -> int:
    """The number of tasks in a tasks JSONL, or :class:`CollectError` naming the line, column and what to fix:
    a missing file, a folder, a line that is not a JSON object, a task without ``responses_create_params``,
    or no task at all. Checked here, before a job starts and anything is written."""
    if not path.exists():
        raise CollectError(f"no tasks file {path} (relative paths are relative to {Path.cwd()})")
    if not path.is_file():
        raise CollectError(f"{path} is not a file; give a tasks JSONL (one task object a line)")
    tasks = 0
    try:
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                _check_task(path, number, line)
                tasks += 1
                if limit is not None and tasks >= limit:
                    break
    except UnicodeDecodeError:
        raise CollectError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise CollectError(f"cannot read {path}: {exc.strerror or exc}") from None
    if tasks == 0:
        raise CollectError(f"{path} holds no task (one JSON object a line); nothing was started or written")
    return tasks


def _check_task(path: Path, number: int, line: str) -> None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CollectError(f"{path}, line {number}, column {exc.colno}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise CollectError(f"{path}, line {number}: a task must be a JSON object, not {type(row).__name__}")
    if not isinstance(row.get("responses_create_params"), dict):
        raise CollectError(
            f"{path}, line {number}: the task has no responses_create_params object "
            '(the model request of its episode: {"input": [...]})'
        )


def refuse_overwrite(output: Path, overwrite: bool) -> None:
    """Results of an earlier job are never replaced unless asked: a checkpoint of that job reads them."""
    try:
        size = output.stat().st_size if output.exists() else 0
    except OSError:
        size = 0
    if output.is_dir():
        raise CollectError(f"--output {output} is a folder; give a file name")
    if size and not overwrite:
        raise CollectError(
            f"{output} already holds {human_bytes(size)} of results (an earlier job's; a checkpoint of that job "
            f"needs them to restore); choose another file with --output, or replace it with --overwrite"
        )


def reward_table(results: Path) -> str:
    """Per agent: episodes, errors, mean and min/max reward, from the results JSONL."""
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for line in results.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            by_agent.setdefault(row.get("agent", "?"), []).append(row)
    rows = []
    for agent, items in sorted(by_agent.items()):
        rewards = [float(r["reward"]) for r in items if isinstance(r.get("reward"), (int, float))]
        errors = sum(1 for r in items if "error" in r)
        mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
        spread = f"{min(rewards):g} .. {max(rewards):g}" if rewards else "-"
        rows.append([agent, len(items), errors, mean, spread])
    return table(["agent", "episodes", "errors", "mean reward", "range"], rows)
