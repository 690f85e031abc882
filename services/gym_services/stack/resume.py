"""Automatic resume: ``gymckpt up`` on a state folder whose stack checkpointed itself continues from its checkpoint.

The stack's history (:mod:`gym_services.stack.history`) says which checkpoints the stack took and how it stopped.
The newest published checkpoint of the current lineage is restored into the fresh servers: after a termination, the
final checkpoint; when that failed (storage unreachable at the signal), or after a crash with no warning (SIGKILL of
everything), the newest scheduled one, and the line the caller prints says how much older it is. ``--fresh`` starts
a new lineage instead: nothing is restored, and no later resume goes back to the old one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from gym_services.base.config import StorageConfig
from gym_services.base.text import human_seconds
from gym_services.control.storage import StorageError, open_storage
from gym_services.control.store import CheckpointStore
from gym_services.coordination.client import ControlClient
from gym_services.coordination.coordinator import Coordinator, TransactionResult
from gym_services.stack.discovery import discover
from gym_services.stack.history import StackHistory, TakenCheckpoint, read_history, write_history
from gym_services.stack.launcher import StackError, StackState, stack_secrets, stack_storage_config


@dataclass
class Resumed:
    """What :func:`resume_stack` did: the checkpoint restored (None: nothing to resume) and the line saying so."""

    checkpoint: TakenCheckpoint | None
    line: str
    result: TransactionResult | None = None


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def explain(history: StackHistory, chosen: TakenCheckpoint, skipped: list[str]) -> str:
    """One line: which checkpoint the stack resumes from, and why that one."""
    head = f"resumed automatically from {chosen.checkpoint_id}"
    gone = f" (newer ones no longer stored: {', '.join(skipped)})" if skipped else ""
    termination = history.termination
    if history.stopped == "termination" and termination is not None:
        final = termination.final
        if termination.outcome == "published" and final is not None and final.checkpoint_id == chosen.checkpoint_id:
            took = human_seconds(termination.signal_to_published_s or 0.0)
            return (
                f"{head}, the checkpoint the stack took on {termination.signalled[0]}'s SIGTERM at "
                f"{_clock(termination.signalled_at)} (published {took} after the signal)"
            )
        older = human_seconds(termination.signalled_at - (chosen.ended_at or chosen.started_at))
        return (
            f"{head}, the newest scheduled checkpoint, {older} older than the SIGTERM at "
            f"{_clock(termination.signalled_at)}: the final checkpoint failed ({termination.error or 'no time left'})"
            f"{gone}"
        )
    seen = history.seen_running_at or chosen.ended_at or chosen.started_at
    older = human_seconds(seen - (chosen.ended_at or chosen.started_at))
    how = (
        "`gymckpt down --no-checkpoint`"
        if history.stopped == "no_checkpoint"
        else "the stack stopped without a termination signal (a crash, SIGKILL)"
    )
    return (
        f"{head}, the newest scheduled checkpoint, taken {older} before the stack was last seen running "
        f"at {_clock(seen)}: {how}{gone}"
    )


def published_candidate(history: StackHistory, store: CheckpointStore) -> tuple[TakenCheckpoint | None, list[str]]:
    """The newest checkpoint of the lineage that storage still holds published, and the newer ones it no longer
    holds. :class:`StorageError` when storage cannot be read."""
    skipped: list[str] = []
    for taken in history.in_lineage():
        if store.is_published(taken.checkpoint_id):
            return taken, skipped
        skipped.append(taken.checkpoint_id)
    return None, skipped


async def resume_stack(
    state: StackState, *, fresh: bool = False, storage_config: StorageConfig | None = None
) -> Resumed:
    """Restore the stack's newest checkpoint into its fresh servers (or start a new lineage with ``fresh``), and
    record it in the history. :class:`StackError` naming the next step when it cannot. ``storage_config``: how
    storage is reached (default: the stack's own way, :func:`~gym_services.stack.launcher.stack_storage_config`)."""
    state_dir = Path(state.state_dir)
    history = read_history(state_dir)
    if history is None:
        return Resumed(None, "")
    if fresh:
        history.lineage += 1
        history.resumed_from = None
        history.stopped = None  # running again: a crash from now on is told as one (before the supervisor's first save)
        write_history(state_dir, history)
        return Resumed(None, f"started fresh (--fresh): the {len(history.kept)} checkpoints taken before stay stored")
    if not history.in_lineage():
        return Resumed(None, "")
    storage_config = storage_config or stack_storage_config(state)
    try:
        chosen, skipped = published_candidate(history, CheckpointStore(open_storage(state.storage, storage_config)))
    except StorageError as exc:
        raise StackError(
            f"cannot read the stack's checkpoints at {state.storage} to resume it ({exc}); make storage reachable "
            "and `gymckpt up` again, or `gymckpt up --fresh` to start empty (the checkpoints stay)"
        ) from None
    if chosen is None:
        return Resumed(None, f"nothing to resume: the stack's checkpoints are no longer stored ({', '.join(skipped)})")
    token = stack_secrets(state_dir)["control_token"]
    async with ControlClient(token, timeout_s=120) as client:
        coordinator = Coordinator(await discover(state, client), client, storage_config=storage_config)
        result = await coordinator.restore(chosen.checkpoint_id, state.storage)
    if not result.completed:
        raise StackError(
            f"resuming from {chosen.checkpoint_id} failed: {result.error}; `gymckpt up --fresh` starts empty "
            f"(the checkpoint stays: `gymckpt restore {chosen.checkpoint_id}` tries again)"
        )
    line = explain(history, chosen, skipped)
    history.resumed_from = chosen.checkpoint_id
    history.stopped = None  # running again: a crash from now on is told as one (before the supervisor's first save)
    write_history(state_dir, history)
    return Resumed(chosen, f"{line}; {len(result.episodes)} episodes continue as attempt + 1", result)
