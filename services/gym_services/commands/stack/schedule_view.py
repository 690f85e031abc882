"""What ``gymckpt status`` says of the stack's own checkpoints: the schedule, the last, next and last successful
checkpoint, and the latest termination (from the stack's history, :mod:`gym_services.stack.history`)."""

from __future__ import annotations

import time
from pathlib import Path

from gym_services.stack.history import TakenCheckpoint, ago, read_history
from gym_services.stack.launcher import StackError, is_running, read_state


def _taken(taken: TakenCheckpoint | None) -> str:
    if taken is None:
        return "none yet"
    when = ago(taken.ended_at or taken.started_at)
    if taken.status == "running":
        return f"{taken.checkpoint_id} ({taken.kind}), under way since {ago(taken.started_at)}"
    if taken.status == "failed":
        return f"{taken.checkpoint_id} ({taken.kind}) FAILED {when}: {taken.error}"
    pause = f"pause {taken.pause_s * 1000:.0f} ms, " if taken.pause_s is not None and taken.kind == "scheduled" else ""
    return f"{taken.checkpoint_id} ({taken.kind}) {when} ({pause}{taken.episodes} live episodes)"


def schedule_lines(state_dir: Path) -> list[str]:
    """The lines under the participants' table; none for a stack without a supervisor."""
    try:
        state = read_state(state_dir)
    except StackError:
        return []
    if state.checkpoint is None:
        return []
    history = read_history(state_dir)
    supervisor = state.supervisor
    alive = supervisor is not None and is_running(supervisor)
    lines = [
        f"schedule: {state.checkpoint.describe()}; supervisor "
        + (
            f"pid {supervisor.pid}"
            if alive and supervisor is not None
            else "NOT RUNNING (`gymckpt up CONFIG` starts it)"
        )
    ]
    if history is None:
        return lines
    lines.append(f"last checkpoint: {_taken(history.last)}")
    if history.next_at is not None and alive:
        lines.append(f"next checkpoint: in {max(0.0, history.next_at - time.time()):.0f}s")
    lines.append(f"last successful: {_taken(history.last_successful())}")
    if history.resumed_from:
        lines.append(f"resumed from: {history.resumed_from}")
    return lines
