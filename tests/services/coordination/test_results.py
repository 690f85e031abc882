"""A transaction's result, built in one place from each source it can come from (plain values, no I/O), and its
progress told to the event sink."""

from __future__ import annotations

import logging

import pytest

from gym_services.control import layout
from gym_services.control.models import (
    SCHEMA_VERSION,
    GlobalManifest,
    ManifestParticipant,
    PersistResponse,
    Replica,
    RestoreResponse,
)
from gym_services.control.protocol import CheckpointMethod, Role
from gym_services.control.store import Published
from gym_services.coordination.client import ParticipantRef
from gym_services.coordination.results import Outcome, Progress
from gym_services.coordination.transaction import (
    BlockerInfo,
    TransactionKind,
    TransactionPhase,
    TransactionStatus,
)

REFS = [
    ParticipantRef("controller", Role.CONTROLLER, "http://controller"),
    ParticipantRef("agent-0", Role.AGENT, "http://agent-0", replica=Replica(group="agent", ordinal=0, replicas=2)),
]


def persisted(pid: str, records: int, episodes: list[str], **extra: int) -> PersistResponse:
    return PersistResponse(
        checkpoint_id="ck",
        participant_id=pid,
        role=Role.AGENT,
        manifest_key=f"checkpoints/ck/participants/{pid}/manifest.json",
        manifest_sha256="0" * 64,
        manifest_size=10,
        records=records,
        bytes=100 * records,
        episodes=episodes,
        **extra,
    )


def global_manifest() -> GlobalManifest:
    return GlobalManifest(
        schema_version=SCHEMA_VERSION,
        checkpoint_id="ck",
        transaction_id="tx",
        created_at=0.0,
        participants=[
            ManifestParticipant(
                participant_id=ref.participant_id,
                role=ref.role,
                replica=ref.replica,
                manifest_key=f"m/{ref.participant_id}",
                manifest_sha256="0" * 64,
                manifest_size=10,
                records=2,
                bytes=200,
                objects=3,
                written_bytes=210,
            )
            for ref in REFS
        ],
        episodes=["r2", "r1"],
        timings={"pause": 0.02, "persist": 0.5},
        bytes=400,
        method=CheckpointMethod.SYNC,
    )


def checkpoint_progress() -> Progress:
    progress = Progress(TransactionKind.CHECKPOINT, "ck", "file:///s", transaction_id="tx")
    progress.clock.timings.update(prepare=0.01, capture=0.02, resume=0.001, pause=0.04, published=0.3)
    return progress


def test_a_checkpoint_published_by_this_transaction() -> None:
    answers = {
        "controller": persisted("controller", 2, ["r1", "r2"], objects=2, written_bytes=250, reused=0),
        "agent-0": persisted("agent-0", 3, ["r1"], objects=1, written_bytes=120, reused=4),
    }
    published = Published(layout.global_manifest_key("ck"), global_manifest(), size=900)
    result = checkpoint_progress().completed(Outcome.checkpointed(REFS, answers, ["r1", "r2"], published), ["w"])
    assert result.status is TransactionStatus.COMPLETED and result.phase is TransactionPhase.COMPLETED
    assert (result.kind, result.checkpoint_id, result.location) == (TransactionKind.CHECKPOINT, "ck", "file:///s")
    assert [(p.participant_id, p.records, p.bytes, p.episodes) for p in result.participants] == [
        ("controller", 2, 200, 2),
        ("agent-0", 3, 300, 1),
    ]
    assert result.participants[1].replica == REFS[1].replica
    assert (result.records, result.bytes) == (5, 500)
    assert (result.objects, result.written_bytes, result.reused) == (4, 370 + 900, 4)  # and the global manifest
    assert result.pause_s == 0.04 and result.published_s == 0.3 and result.method is CheckpointMethod.SYNC
    assert result.episodes == {"r1": 0, "r2": 0} and result.manifest_key == layout.global_manifest_key("ck")
    assert (result.transaction_id, result.restore_id, result.error, result.warnings) == ("tx", None, None, ["w"])


def test_a_checkpoint_this_transaction_had_published_already() -> None:
    """A repeat writes nothing: its figures are the manifest's, its timings those of the run that published."""
    result = checkpoint_progress().completed(Outcome.published_earlier(global_manifest()), ["already published"])
    assert result.status is TransactionStatus.COMPLETED
    assert [(p.participant_id, p.records, p.manifest_key) for p in result.participants] == [
        ("controller", 2, "m/controller"),
        ("agent-0", 2, "m/agent-0"),
    ]
    assert (result.records, result.bytes, result.objects, result.written_bytes) == (4, 400, 0, 0)
    assert result.timings == {"pause": 0.02, "persist": 0.5} and result.pause_s == 0.02
    assert result.published_s is None and result.method is None
    assert result.episodes == {"r2": 0, "r1": 0} and result.transaction_id == "tx"


def test_a_restore_continues_each_rollout_at_its_highest_attempt() -> None:
    progress = Progress(TransactionKind.RESTORE, "ck", "file:///s", restore_id="rs")
    progress.clock.timings.update(restore=0.2, resume=0.01, total=0.25)
    entries = {p.participant_id: p for p in global_manifest().participants}
    answers = {
        "controller": RestoreResponse(
            checkpoint_id="ck",
            participant_id="controller",
            role=Role.CONTROLLER,
            records=2,
            bytes=20,
            episodes={"r1": 1},
        ),
        "agent-0": RestoreResponse(
            checkpoint_id="ck",
            participant_id="agent-0",
            role=Role.AGENT,
            records=1,
            bytes=5,
            episodes={"r1": 2, "r2": 1},
        ),
    }
    result = progress.completed(Outcome.restored("ck", REFS, entries, answers), [])
    assert result.kind is TransactionKind.RESTORE and result.status is TransactionStatus.COMPLETED
    assert result.episodes == {"r1": 2, "r2": 1}
    assert [(p.participant_id, p.manifest_key, p.episodes) for p in result.participants] == [
        ("controller", "m/controller", 1),
        ("agent-0", "m/agent-0", 2),
    ]
    assert (result.records, result.bytes, result.pause_s) == (3, 25, 0.25)  # a restore pauses throughout
    assert (result.restore_id, result.transaction_id, result.method, result.published_s) == ("rs", None, None, None)
    assert result.manifest_key == layout.global_manifest_key("ck")


@pytest.mark.parametrize("kind", list(TransactionKind))
def test_a_failure_keeps_the_phase_it_reached_and_what_it_measured(kind: TransactionKind) -> None:
    ids = {"transaction_id": "tx"} if kind is TransactionKind.CHECKPOINT else {"restore_id": "rs"}
    progress = Progress(kind, "ck", "file:///s", phase=TransactionPhase.PREPARING, **ids)
    progress.clock.timings.update(prepare=0.3, pause=0.31)
    blocker = BlockerInfo(participant="agent-0", kind="episode", id="r9", detail="tool call running")
    result = progress.failed("1 blockers", blockers=[blocker], warnings=["w"])
    assert result.status is TransactionStatus.FAILED and result.phase is TransactionPhase.PREPARING
    assert result.error == "1 blockers" and result.blockers == [blocker] and result.warnings == ["w"]
    assert result.participants == [] and result.records == 0 and result.manifest_key is None
    assert result.timings == {"prepare": 0.3, "pause": 0.31}
    assert result.pause_s == (0.31 if kind is TransactionKind.CHECKPOINT else 0.0)
    assert (result.transaction_id, result.restore_id) == (ids.get("transaction_id"), ids.get("restore_id"))


async def test_progress_tells_the_sink_and_a_failing_sink_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    told: list[tuple[TransactionPhase, dict]] = []

    async def sink(phase: TransactionPhase, detail: dict) -> None:
        told.append((phase, detail))

    progress = Progress(TransactionKind.CHECKPOINT, "ck", "file:///s", sink=sink, transaction_id="tx")
    await progress.enter(TransactionPhase.PREPARING, participants=3)
    await progress.report(TransactionPhase.ABORTING, error="boom")
    assert progress.phase is TransactionPhase.PREPARING  # reported, not reached
    assert told == [
        (TransactionPhase.PREPARING, {"checkpoint_id": "ck", "participants": 3}),
        (TransactionPhase.ABORTING, {"checkpoint_id": "ck", "error": "boom"}),
    ]

    def broken(phase: TransactionPhase, detail: dict) -> None:
        raise RuntimeError("404 Not Found")

    progress.sink = broken
    with caplog.at_level(logging.WARNING):
        await progress.enter(TransactionPhase.CAPTURING)
    assert progress.phase is TransactionPhase.CAPTURING
    assert "event sink failed on Capturing: RuntimeError: 404 Not Found" in caplog.text
