"""Status documents and conditions for Checkpoint and Restore resources (Kubernetes conventions).

The kopf handlers (:mod:`gym_operator.handlers`) patch these into ``status``; every phase written is a
:class:`~gym_services.coordination.transaction.TransactionPhase` (``docs/protocol.md``, "Transactions").
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from gym_services.coordination.transaction import (
    ParticipantSummary,
    TransactionKind,
    TransactionPhase,
    TransactionResult,
)


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, status: bool, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": now(),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def keep_transition_times(old: list[dict[str, Any]] | None, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``new`` conditions, each keeping its earlier ``lastTransitionTime`` when its status did not change
    (Kubernetes API conventions: the time is of the last transition, not of the last write)."""
    before = {c.get("type"): c for c in old or []}
    out = []
    for cond in new:
        previous = before.get(cond["type"])
        if previous is not None and previous.get("status") == cond["status"] and previous.get("lastTransitionTime"):
            cond = {**cond, "lastTransitionTime": previous["lastTransitionTime"]}
        out.append(cond)
    return out


def progress_status(phase: TransactionPhase, message: str, generation: int | None, **extra: Any) -> dict[str, Any]:
    return {
        "phase": phase.value,
        "reason": phase.value,
        "message": message,
        "conditions": [condition("Progressing", True, phase.value, message, generation)],
        **extra,
    }


def pending_status(reason: str, message: str, generation: int | None) -> dict[str, Any]:
    return {
        "phase": TransactionPhase.PENDING.value,
        "reason": reason,
        "message": message,
        "conditions": [condition("Progressing", False, reason, message, generation)],
    }


def failed_status(reason: str, message: str, generation: int | None, **extra: Any) -> dict[str, Any]:
    return {
        "phase": TransactionPhase.FAILED.value,
        "reason": reason,
        "message": message,
        "completionTime": now(),
        "conditions": [
            condition("Progressing", False, reason, message, generation),
            condition("Failed", True, reason, message, generation),
            condition("Completed", False, reason, message, generation),
        ],
        **extra,
    }


def _participant(p: ParticipantSummary) -> dict[str, Any]:
    """One participant's line: every replica of a replicated server is its own participant, named with its
    server (``group``), ordinal and replica count, holding its own episodes (checkpoint) or restoring them."""
    entry: dict[str, Any] = {
        "id": p.participant_id,
        "role": p.role.value,
        "records": p.records,
        "bytes": p.bytes,
        "episodes": p.episodes,
    }
    if p.replica is not None:
        entry["replica"] = p.replica.model_dump(mode="json")
    return entry


def result_status(result: TransactionResult, generation: int | None) -> dict[str, Any]:
    """The final status of a Checkpoint or Restore from the coordinator's result."""
    body: dict[str, Any] = {
        "checkpointId": result.checkpoint_id,
        "location": result.location,
        "participants": [_participant(p) for p in result.participants],
        "participantCount": len(result.participants),
        "blockers": [b.model_dump(mode="json", exclude_none=True) for b in result.blockers],
        "timings": {k: round(v, 6) for k, v in result.timings.items()},
        "pauseSeconds": round(result.pause_s, 6),
        "bytes": result.bytes,
        "records": result.records,
    }
    replicas = {p.replica.group: p.replica.replicas for p in result.participants if p.replica is not None}
    if replicas:
        body["replicas"] = dict(sorted(replicas.items()))
    if result.kind is TransactionKind.CHECKPOINT and result.method is not None:
        body["method"] = result.method.value
        body["objects"] = result.objects
        body["writtenBytes"] = result.written_bytes
        body["reusedRecords"] = result.reused
        if result.published_s is not None:
            body["publishedSeconds"] = round(result.published_s, 6)
    if result.kind is TransactionKind.CHECKPOINT:
        body["episodes"] = len(result.episodes)
        if result.final and result.completed:  # asked (spec.final), or a participant terminating made it final
            body["final"] = True
    if result.kind is TransactionKind.RESTORE:
        body["attempt"] = max(result.episodes.values(), default=0)
        body["restoredEpisodes"] = len(result.episodes)
        if result.restore_id:
            body["restoreId"] = result.restore_id
    if result.completed:
        message = f"{result.kind} {result.checkpoint_id} completed: {result.records} records, {result.bytes} bytes"
        if result.warnings:
            message += "; warnings: " + "; ".join(result.warnings)
        return {
            **body,
            "phase": TransactionPhase.COMPLETED.value,
            "reason": "Completed",
            "message": message,
            "completionTime": now(),
            "conditions": [
                condition("Progressing", False, "Completed", message, generation),
                condition("Completed", True, "Completed", message, generation),
                condition("Failed", False, "Completed", message, generation),
            ],
        }
    reason = "Blocked" if result.blockers else "TransactionFailed"
    return failed_status(reason, result.error or "failed", generation, **body)
