"""A job's results file: one JSON row per finished episode, appended and synced, and at restore its first bytes
proven to be the ones a checkpoint saw before it is cut back to them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from gym_services.collection.models import EpisodeState, JobState
from gym_services.control.participant import InvalidState


def result_row(episode: EpisodeState, result: dict[str, Any] | None, error: str | None) -> dict[str, Any]:
    """The row of a finished episode: its result, or the error that ended it."""
    row = {
        "_ng_rollout_id": episode.rollout_id,
        "_ng_task_index": episode.task_index,
        "_ng_rollout_index": episode.rollout_index,
        "_ng_attempt_index": episode.attempt,
        "agent": episode.agent,
        "reward": (result or {}).get("reward"),
    }
    if error is not None:
        row["error"] = error
    else:
        row["result"] = result
    return row


def row_line(row: dict[str, Any]) -> bytes:
    return (json.dumps(row, ensure_ascii=False) + "\n").encode()


def append(path: str, line: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def check_output_prefix(job: JobState, chunk: int = 1 << 20) -> Any:
    """Prove the output file's first ``output_offset`` bytes are the ones the checkpoint saw, before
    anything truncates it; :class:`InvalidState` otherwise (another job's results at the same path, a
    file edited or replaced). Returns the hash of those bytes, to carry on from."""
    path, offset = job.spec.output_path, job.output_offset
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            left = offset
            while left > 0:
                data = fh.read(min(chunk, left))
                if not data:
                    break
                digest.update(data)
                left -= len(data)
            last = b""
            if offset > 0 and left == 0:
                fh.seek(offset - 1)
                last = fh.read(1)
    except FileNotFoundError:
        left, last = offset, b""
    except OSError as exc:
        raise InvalidState(f"cannot read the results file {path}: {exc}") from None
    refuse = f"restore refused, nothing changed: the results file {path} "
    if left > 0:
        raise InvalidState(refuse + f"holds {offset - left} bytes, fewer than the {offset} the checkpoint saw")
    if job.output_sha256 is not None:
        if digest.hexdigest() != job.output_sha256:
            raise InvalidState(
                refuse + f"does not start with the {offset} bytes the checkpoint saw (their sha256 differs): it holds "
                "other content, e.g. another job's results; move it away or restore into another output path"
            )
    elif offset > 0 and last != b"\n":  # a checkpoint from before the digest: at least a line must end there
        raise InvalidState(refuse + f"has no line end at byte {offset}, where the checkpoint's results ended")
    return digest


def truncate(path: str, size: int) -> None:
    if size == 0 and not os.path.exists(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:  # creates a missing file (a checkpoint with no result yet)
        fh.truncate(size)
        fh.flush()
        os.fsync(fh.fileno())
