"""``gymckpt status`` as a table that fits a terminal: one line per participant, then what the newest
checkpoint transaction did. ``--wide`` adds every detail, ``--json`` gives the raw answers."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gym_services.base.text import table
from gym_services.control.models import StatusResponse
from gym_services.coordination.client import ParticipantError

#: the width a status without --wide stays within
WIDTH = 120
NOT_RUNNING = "not running"


def state_of(status: StatusResponse) -> str:
    """What the participant is doing: ``serving`` while admission is open and no checkpoint holds it (the
    control plane's ``fresh``/``open``), else the phase of the checkpoint or restore it is in; ``terminating (12s
    left)`` before either once it got a termination signal."""
    state = "serving" if status.admission_open and status.checkpoint_id is None else str(status.phase)
    if status.terminating is not None:
        left = f"{status.terminating.left_s:.0f}s left"
        return f"terminating ({left})" if state == "serving" else f"terminating, {state} ({left})"
    return state


def live_cell(live: dict[str, Any], limit: int | None = None) -> str:
    """``episodes=3, running=1``: counts only (a nested value shows as its size), zeros left out but the first
    (the participant's main count); cut at ``limit`` characters."""
    parts = []
    for index, (key, value) in enumerate(live.items()):
        if isinstance(value, dict | list):
            if limit is None:
                parts.append(f"{key}={len(value)}")
            continue
        if isinstance(value, bool) or (not value and index and limit is not None):
            continue
        parts.append(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}")
    text = ", ".join(parts)
    if limit is not None and len(text) > limit:
        text = text[: limit - 3].rstrip(", ") + "..."
    return text


def _upload(status: StatusResponse) -> str:
    job = status.persist
    if job is None:
        return ""
    if job.state == "persisting":
        return f"{job.checkpoint_id} persisting {job.encoded}/{job.records}"
    return f"{job.checkpoint_id} {job.state} {job.records} records" + (f": {job.error}" if job.error else "")


def status_table(
    statuses: dict[str, StatusResponse | ParticipantError], stopped: list[str], *, wide: bool = False
) -> str:
    """The table and, under it, the newest transaction: the checkpoint open now, or the last upload's outcome.
    Without ``wide`` the live cell gets what the other columns leave of :data:`WIDTH`."""
    open_now = any(isinstance(s, StatusResponse) and s.checkpoint_id for s in statuses.values())
    headers = ["participant", "role", "state", "live"]
    if open_now or wide:
        headers += ["checkpoint", "blockers"]
    if wide:
        headers += ["last upload", "last event"]
    rows: list[list[Any]] = []
    lives: list[dict[str, Any] | str] = []
    for name in stopped:
        rows.append([name, "?", NOT_RUNNING] + [""] * (len(headers) - 4))
        lives.append("")
    for pid, s in statuses.items():
        if isinstance(s, ParticipantError):
            rows.append([pid, "?", "unreachable"] + [""] * (len(headers) - 4))
            lives.append(s.reason)
            continue
        row: list[object] = [pid, str(s.role), state_of(s)]
        if open_now or wide:
            row += [s.checkpoint_id or "", len(s.blockers) if s.checkpoint_id else ""]
        if wide:
            row += [_upload(s), s.last_event or ""]
        rows.append(row)
        lives.append(s.live)
    others = [
        max([len(headers[i if i < 3 else i + 1]), *(len(str(r[i])) for r in rows)]) for i in range(len(headers) - 1)
    ]
    limit = None if wide else max(16, WIDTH - sum(others) - 2 * (len(headers) - 1))
    for row, live in zip(rows, lives, strict=True):
        cell = live_cell(live, limit) if isinstance(live, dict) else (live if limit is None else live[:limit])
        row.insert(3, cell)
    lines = [table(headers, rows), *summary(statuses)]
    if not wide:
        lines = [
            line if len(line) <= WIDTH else line[: WIDTH - 3] + "..." for text in lines for line in text.splitlines()
        ]
    return "\n".join(lines)


def summary(statuses: dict[str, StatusResponse | ParticipantError]) -> list[str]:
    """One line on the checkpoint open now, else on the newest background upload, and the participants'
    last event when they agree (a lease that ran out names what it aborted)."""
    answered = [s for s in statuses.values() if isinstance(s, StatusResponse)]
    lines = []
    holding = Counter((s.checkpoint_id, str(s.phase)) for s in answered if s.checkpoint_id)
    if holding:
        for (cid, phase), count in sorted(holding.items()):
            lines.append(f"checkpoint {cid}: {phase} on {count} of {len(answered)} participants")
    uploads = [s.persist for s in answered if s.persist is not None]
    if uploads:
        newest = Counter(job.checkpoint_id for job in uploads).most_common(1)[0][0]  # each reports its newest
        jobs = [job for job in uploads if job.checkpoint_id == newest]
        states = Counter(str(job.state) for job in jobs)
        outcome = ", ".join(f"{state} on {count}" for state, count in sorted(states.items()))
        errors = [job.error for job in jobs if job.error]
        lines.append(
            f"last checkpoint upload {newest}: {outcome} of {len(jobs)} participants; "
            f"{sum(job.records for job in jobs)} records" + (f"; error: {errors[0]}" if errors else "")
        )
    events = Counter(s.last_event for s in answered if s.last_event)
    if events:
        event, count = events.most_common(1)[0]
        share = "" if count == len(answered) else f" ({count} of {len(answered)} participants)"
        lines.append(f"last event: {event}{share}")
    return lines
