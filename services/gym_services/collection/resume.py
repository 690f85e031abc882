"""Resuming a collection from its results file alone (no checkpoint): ``gymckpt collect --resume``.

As NeMo Gym's rollout collection resumes (``resume_from_cache``): the results file already written is kept, a last
line a kill cut short is dropped, and only the (task, repeat) pairs it does not hold yet run. Unlike it, a results
file written from other tasks or another number of repeats is refused rather than mixed in: every job writes
``<results>.job.json`` beside its results (:class:`JobFile`: the digest of its tasks, how many, the repeats), and a
resume must match it. A checkpoint, when there is one, is better: it keeps the episodes in flight too, where this
runs them again from their start.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gym_services.base.errors import ApiError, ErrorCode

JOB_FILE_SUFFIX = ".job.json"


class JobFile(BaseModel):
    """What a results file was written from."""

    model_config = ConfigDict(extra="ignore")

    tasks_sha256: str
    tasks: int
    repeats: int
    tasks_path: str


def job_file_path(output_path: str) -> Path:
    return Path(output_path + JOB_FILE_SUFFIX)


def tasks_sha256(tasks: list[dict[str, Any]]) -> str:
    """The tasks as a job reads them (after ``limit``), independent of key order and whitespace."""
    digest = hashlib.sha256()
    for task in tasks:
        digest.update(json.dumps(task, sort_keys=True, separators=(",", ":")).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def write_job_file(output_path: str, tasks_path: str, tasks: list[dict[str, Any]], repeats: int) -> None:
    job = JobFile(tasks_sha256=tasks_sha256(tasks), tasks=len(tasks), repeats=repeats, tasks_path=tasks_path)
    path = job_file_path(output_path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(job.model_dump_json(indent=1))
    os.replace(tmp, path)


@dataclass
class Earlier:
    """The results an earlier run left: their bytes (a prefix of the file), its digest, and each row's outcome."""

    size: int = 0
    digest: Any = field(default_factory=hashlib.sha256)
    #: flat index (task * repeats + repeat) -> rollout id
    done: dict[int, str] = field(default_factory=dict)
    reward_sum: float = 0.0
    errors: int = 0


def _refuse(output: str, why: str) -> ApiError:
    return ApiError(
        ErrorCode.BAD_REQUEST,
        f"cannot resume into {output}: {why}; collect into another --output, or replace it with --overwrite",
    )


def _check_job_file(output: str, tasks: list[dict[str, Any]], repeats: int) -> None:
    path = job_file_path(output)
    try:
        job = JobFile.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise _refuse(output, f"nothing says which tasks wrote it ({path.name} is missing)") from None
    except (OSError, ValidationError, ValueError) as exc:
        raise _refuse(output, f"{path.name} cannot be read ({type(exc).__name__})") from None
    if job.repeats != repeats:
        raise _refuse(output, f"it was written with {job.repeats} repeats per task, this job has {repeats}")
    if job.tasks != len(tasks) or job.tasks_sha256 != tasks_sha256(tasks):
        raise _refuse(
            output,
            f"it was written from other tasks ({job.tasks} tasks from {job.tasks_path}; "
            f"this job has {len(tasks)}, and their content differs)",
        )


def read_earlier(output: str, tasks: list[dict[str, Any]], repeats: int) -> Earlier:
    """The results ``output`` holds from an earlier run of the same tasks and repeats (:class:`ApiError` refusing
    anything else). A last line a kill cut short is cut off the file; nothing else is changed."""
    earlier = Earlier()
    path = Path(output)
    if not path.exists() or path.stat().st_size == 0:
        return earlier
    _check_job_file(output, tasks, repeats)
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # the tail is b"" when the file ends with a newline
    for number, line in enumerate(complete, 1):
        _take(earlier, output, number, line, len(tasks), repeats)
    earlier.size = len(data) - len(tail)
    earlier.digest.update(data[: earlier.size])
    if tail:
        with open(path, "ab") as fh:  # cut short by a kill: it runs again
            fh.truncate(earlier.size)
    return earlier


def _take(earlier: Earlier, output: str, number: int, line: bytes, tasks: int, repeats: int) -> None:
    """One result row into ``earlier``: a malformed row, one out of range or one seen twice is refused."""
    try:
        row = json.loads(line)
        task_index, repeat = int(row["_ng_task_index"]), int(row["_ng_rollout_index"])
        rollout_id = str(row["_ng_rollout_id"])
    except (ValueError, KeyError, TypeError):
        raise _refuse(output, f"line {number} is not a result row") from None
    if not (0 <= task_index < tasks and 0 <= repeat < repeats):
        raise _refuse(output, f"line {number} is task {task_index} repeat {repeat}, outside this job's tasks")
    index = task_index * repeats + repeat
    if index in earlier.done:
        raise _refuse(output, f"line {number} is task {task_index} repeat {repeat} again")
    earlier.done[index] = rollout_id
    if "error" in row:
        earlier.errors += 1
    elif isinstance(row.get("reward"), (int, float)):
        earlier.reward_sum += float(row["reward"])
