"""Plain-text tables and summaries for the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gym_services.coordination.coordinator import TransactionResult


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def transaction_summary(result: TransactionResult) -> str:
    head = f"{result.kind} {result.checkpoint_id}: {result.status.upper()} at {result.location}"
    if result.restore_id:
        head += f" (restore id {result.restore_id})"
    lines = [head]
    if result.error:
        lines.append(f"error: {result.error}")
    if result.blockers:
        lines.append("blockers:")
        lines.append(table(["participant", "kind", "id", "detail"], [[b.participant, b.kind, b.id, b.detail] for b in result.blockers]))
    if result.participants:
        lines.append(
            table(
                ["participant", "role", "records", "bytes", "episodes"],
                [[p.participant_id, p.role, p.records, human_bytes(p.bytes), p.episodes] for p in result.participants],
            )
        )
    if result.timings:
        lines.append("timings: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in result.timings.items()))
    if result.status == "completed":
        what = "pause seen by rollouts" if result.kind == "checkpoint" else "restore took"
        lines.append(f"{what}: {result.pause_s * 1000:.1f} ms; {result.records} records, {human_bytes(result.bytes)}")
        if result.kind == "restore" and result.episodes:
            lines.append(f"episodes continuing as a new attempt: {len(result.episodes)}")
    for warning in result.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
