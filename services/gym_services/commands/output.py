"""Transaction summaries for the CLI (``gymckpt checkpoint``, ``gymckpt restore``)."""

from __future__ import annotations

from gym_services.base.text import human_bytes, table
from gym_services.coordination.coordinator import TransactionResult

__all__ = ["EXIT_INTERRUPTED", "transaction_summary"]

#: the exit status of a command stopped by Ctrl-C (SIGINT), as shells report it
EXIT_INTERRUPTED = 128 + 2


def transaction_summary(result: TransactionResult) -> str:
    head = f"{result.kind} {result.checkpoint_id}: {result.status.upper()} at {result.location}"
    if result.restore_id:
        head += f" (restore id {result.restore_id})"
    if result.transaction_id:
        head += f" (transaction {result.transaction_id})"
    lines = [head]
    if result.error:
        lines.append(f"error: {result.error}")
    if result.blockers:
        lines.append("blockers:")
        lines.append(
            table(
                ["participant", "kind", "id", "waiting on", "detail"],
                [[b.participant, b.kind, b.id, b.server or "", b.detail] for b in result.blockers],
            )
        )
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
        if result.kind == "checkpoint" and result.published_s is not None:
            lines.append(
                f"published after {result.published_s * 1000:.1f} ms ({result.method}): wrote {result.objects} "
                f"objects, {human_bytes(result.written_bytes)}; {result.reused} records reused from earlier checkpoints"
            )
        if result.kind == "restore" and result.episodes:
            lines.append(f"episodes continuing as a new attempt: {len(result.episodes)}")
    for p in result.participants:
        lines.extend(f"scope: {line}" for line in p.scope.lines(p.participant_id))
    for warning in result.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
