"""What a local stack knows of the checkpoints it took itself: ``<state dir>/history.json``.

The stack's supervisor (:mod:`gym_services.stack.supervisor`) writes it as it runs the schedule and takes the final
checkpoint of a termination: the checkpoints it took and keeps (published, newest last), the last attempt and its
outcome, when the next one is due, the termination it handled. ``gymckpt up`` reads it to resume the stack
(:mod:`gym_services.stack.resume`) and ``gymckpt status`` to show the schedule. The checkpoints of one *lineage*
continue one another; ``gymckpt up --fresh`` starts a new lineage, so a later resume never goes back to the one
before it.

Writes are atomic (a temporary file renamed over the old one), so a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_services.base.config import ConfigError
from gym_services.stack.schedule import CheckpointSettings, describe_duration

HISTORY_FILE = "history.json"

Kind = Literal["scheduled", "final"]


class TakenCheckpoint(BaseModel):
    """One checkpoint the supervisor took (or tried to)."""

    model_config = ConfigDict(extra="ignore")

    checkpoint_id: str
    kind: Kind
    lineage: int = 0
    started_at: float = Field(description="unix time the transaction started")
    ended_at: float | None = None
    status: Literal["running", "completed", "failed"] = "running"
    error: str | None = None
    pause_s: float | None = None
    seconds: float | None = Field(default=None, description="from the start until published (or failed)")
    records: int = 0
    bytes: int = 0
    episodes: int = 0
    final: bool = Field(default=False, description="held as final by every participant: nobody resumed after it")


class Termination(BaseModel):
    """The latest termination the stack saw: who got the signal, the deadline, the final checkpoint's outcome."""

    model_config = ConfigDict(extra="ignore")

    signalled_at: float = Field(description="unix time of the first signal")
    deadline_at: float
    signalled: list[str] = Field(description="the servers that got it (supervisor: the supervisor itself)")
    final: TakenCheckpoint | None = None
    tries: int = 0
    signal_to_published_s: float | None = None
    outcome: Literal["running", "published", "failed"] = "running"
    error: str | None = None


class StackHistory(BaseModel):
    model_config = ConfigDict(extra="ignore")

    settings: CheckpointSettings = Field(default_factory=CheckpointSettings)
    lineage: int = 0
    kept: list[TakenCheckpoint] = Field(default_factory=list, description="published, this stack's, newest last")
    last: TakenCheckpoint | None = Field(default=None, description="the newest attempt, whatever its outcome")
    next_at: float | None = Field(default=None, description="unix time the next scheduled checkpoint is due")
    termination: Termination | None = None
    #: how the stack stopped: a termination (its final checkpoint), `down --no-checkpoint`, or unknown (a crash)
    stopped: Literal["termination", "no_checkpoint"] | None = None
    seen_running_at: float | None = Field(default=None, description="the supervisor's last sign of life")
    resumed_from: str | None = Field(default=None, description="the checkpoint the running stack was restored from")

    def last_successful(self) -> TakenCheckpoint | None:
        return self.kept[-1] if self.kept else None

    def in_lineage(self) -> list[TakenCheckpoint]:
        """The checkpoints a resume may start from, newest first."""
        return [c for c in reversed(self.kept) if c.lineage == self.lineage]

    def newest_final_s(self) -> float | None:
        """The seconds from signal to published of the newest final checkpoint (what a grace must leave room for)."""
        t = self.termination
        return t.signal_to_published_s if t is not None else None

    def newest_scheduled_s(self) -> float | None:
        """How long the newest scheduled checkpoint took, start to published."""
        done = [c for c in self.kept if c.kind == "scheduled" and c.seconds is not None]
        return done[-1].seconds if done else None


def history_path(state_dir: Path) -> Path:
    return state_dir / HISTORY_FILE


def read_history(state_dir: Path) -> StackHistory | None:
    """The stack's history; None when there is none (or it cannot be read: a stack never supervised)."""
    path = history_path(state_dir)
    try:
        return StackHistory.model_validate_json(path.read_text())
    except (OSError, ValidationError, ValueError):
        return None


def write_history(state_dir: Path, history: StackHistory) -> None:
    path = history_path(state_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(history.model_dump_json(indent=1))
    os.replace(tmp, path)


def ago(t: float | None, now: float | None = None) -> str:
    """``12s ago``, ``3m ago``: how long before ``now`` unix time ``t`` was."""
    if t is None:
        return "-"
    seconds = max(0.0, (now or time.time()) - t)
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def clear_stale_tmp(state_dir: Path) -> None:
    """Temporary files a writer killed mid-write left (best effort)."""
    for leftover in state_dir.glob(f".{HISTORY_FILE}.*.tmp"):
        with contextlib.suppress(OSError):
            leftover.unlink()


def refuse_settings(settings: CheckpointSettings, history: StackHistory | None) -> None:
    """:class:`ConfigError` for settings this stack's own checkpoints showed cannot work: a termination grace shorter
    than its final (or scheduled) checkpoint took, an interval shorter than a scheduled checkpoint took. Checked at
    ``gymckpt up``, before anything starts, so a bad value is a refusal and never a stack that fails at every
    signal."""
    if history is None:
        return
    final_s, scheduled_s = history.newest_final_s(), history.newest_scheduled_s()
    measured = max((t for t in (final_s, scheduled_s) if t is not None), default=None)
    if measured is not None and settings.termination_grace < measured:
        what = "its final checkpoint took (signal to published)" if measured == final_s else "its last checkpoint took"
        raise ConfigError(
            f"termination grace {describe_duration(settings.termination_grace)} is shorter than {what} on this "
            f"stack, {measured:.1f}s: the final checkpoint would not fit; give at least "
            f"{describe_duration(float(int(measured) + 2))} (--termination-grace, or checkpoint.termination_grace)"
        )
    if settings.every is not None and scheduled_s is not None and settings.every < scheduled_s:
        raise ConfigError(
            f"checkpoint every {describe_duration(settings.every)} is shorter than a checkpoint of this stack takes "
            f"({scheduled_s:.1f}s, start to published): they would run back to back; give at least "
            f"{describe_duration(float(int(scheduled_s) + 1))} (--checkpoint-every, or checkpoint.every)"
        )
