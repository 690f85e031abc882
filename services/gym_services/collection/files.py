"""Where a collection job may read and write, and tasks in and results out over HTTP.

A job's ``tasks_path`` and ``output_path`` must lie inside the server's ``data_dir`` (on Kubernetes: its
PersistentVolume) or one of its ``job_dirs``; relative paths are relative to the first of those. With a
``data_dir``, tasks can be uploaded and results read back over HTTP:

- ``PUT /tasks/{name}.jsonl``: the body (JSONL, one task object a line) is stored as ``tasks/{name}.jsonl``.
- ``POST /jobs`` with ``tasks_path: tasks/{name}.jsonl`` and ``output_path: results/{job}.jsonl``.
- ``GET /jobs/current/results``: the finished results of the current job (JSONL), as checkpointed.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from starlette.requests import Request

from gym_services.base.errors import ApiError, ErrorCode

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.jsonl$")
TASKS_DIR = "tasks"
RESULTS_DIR = "results"


def confine(roots: list[str], path: str, what: str) -> str:
    """``path`` resolved (symbolic links followed) inside one of ``roots``; relative paths are relative to the
    first. ``403 forbidden`` when it lies outside all of them, or when there are none."""
    if not roots:
        raise ApiError(
            ErrorCode.FORBIDDEN,
            "this collection server has no folder for job files: set data_dir or job_dirs in its config "
            "(e.g. job_dirs: ['.'] for the folder it runs in)",
        )
    resolved = [Path(root).resolve() for root in roots]
    target = (resolved[0] / path).resolve()
    if not any(target == root or root in target.parents for root in resolved):
        where = ", ".join(str(root) for root in resolved)
        raise ApiError(
            ErrorCode.FORBIDDEN,
            f"{what} {path!r} is outside the folders this server may use ({where}); "
            "move it into one of them, or add its folder to the server's job_dirs",
        )
    return str(target)


async def receive_tasks(request: Request, data_dir: str, name: str, max_bytes: int) -> dict[str, object]:
    """Stream an uploaded tasks JSONL to ``data_dir/tasks/name``: every line a JSON object, at most
    ``max_bytes``; written to a temporary file and renamed, so a failed upload leaves nothing."""
    if not NAME.match(name):
        raise ApiError(ErrorCode.BAD_REQUEST, f"task file name {name!r} must match {NAME.pattern}")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:  # refused before a byte of it is read
        raise ApiError(ErrorCode.PAYLOAD_TOO_LARGE, f"task file is larger than {max_bytes} bytes")
    folder = Path(data_dir) / TASKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".part")
    size, tasks, pending, number = 0, 0, b"", 0
    try:
        with os.fdopen(fd, "wb") as fh:
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise ApiError(ErrorCode.PAYLOAD_TOO_LARGE, f"task file is larger than {max_bytes} bytes")
                fh.write(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    number += 1
                    tasks += _check_line(line, number)
            if pending:
                number += 1
                tasks += _check_line(pending, number)
            fh.flush()
            os.fsync(fh.fileno())
        if tasks == 0:
            raise ApiError(ErrorCode.BAD_REQUEST, "task file holds no task")
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {"tasks_path": f"{TASKS_DIR}/{name}", "tasks": tasks, "bytes": size}


def _check_line(line: bytes, number: int) -> int:
    if not line.strip():
        return 0
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(ErrorCode.BAD_REQUEST, f"line {number} is not JSON: {exc}") from None
    if not isinstance(row, dict):
        raise ApiError(ErrorCode.BAD_REQUEST, f"line {number} must be a JSON object")
    return 1


def read_results(path: str, size: int, chunk: int = 1 << 16) -> Iterator[bytes]:
    """The first ``size`` bytes of the output file (the finished, checkpointed part), in chunks."""
    with open(path, "rb") as fh:
        left = size
        while left > 0:
            data = fh.read(min(chunk, left))
            if not data:
                return
            left -= len(data)
            yield data
