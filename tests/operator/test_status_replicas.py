"""A Checkpoint's status shows every replica as its own participant: which replica of which server it is, the live
episodes it held, and the replica count per server (validated against the CRD's status schema)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gym_operator.status import result_status
from gym_services.control.models import Replica
from gym_services.control.protocol import Role
from gym_services.coordination.transaction import (
    ParticipantSummary,
    TransactionKind,
    TransactionPhase,
    TransactionResult,
    TransactionStatus,
)

CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"


def test_each_replica_with_its_episodes_and_the_counts_per_server() -> None:
    participants = [
        ParticipantSummary(
            participant_id=f"gym-agent-{i}",
            role=Role.AGENT,
            records=3 + i,
            bytes=100,
            episodes=2 + i,
            replica=Replica(group="agent", ordinal=i, replicas=2),
        )
        for i in (0, 1)
    ] + [ParticipantSummary(participant_id="legacy", role=Role.RESOURCES, records=1, bytes=10, episodes=0)]
    result = TransactionResult(
        kind=TransactionKind.CHECKPOINT,
        checkpoint_id="ck",
        location="s3://b/p",
        status=TransactionStatus.COMPLETED,
        phase=TransactionPhase.COMPLETED,
        participants=participants,
        episodes={f"r{i}": 0 for i in range(5)},
    )
    status = result_status(result, generation=1)
    assert status["participants"] == [
        {
            "id": "gym-agent-0",
            "role": "agent",
            "records": 3,
            "bytes": 100,
            "episodes": 2,
            "replica": {"group": "agent", "ordinal": 0, "replicas": 2},
        },
        {
            "id": "gym-agent-1",
            "role": "agent",
            "records": 4,
            "bytes": 100,
            "episodes": 3,
            "replica": {"group": "agent", "ordinal": 1, "replicas": 2},
        },
        {"id": "legacy", "role": "resources", "records": 1, "bytes": 10, "episodes": 0},  # not replicated
    ]
    assert status["replicas"] == {"agent": 2} and status["episodes"] == 5
    # every field written is one the CRD's status schema keeps (a structural schema prunes unknown fields)
    for name in ("checkpoints", "restores"):
        schema = yaml.safe_load((CRDS / f"{name}.yaml").read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        fields = schema["properties"]["status"]["properties"]
        item = fields["participants"]["items"]["properties"]
        assert {"episodes", "replica"} <= set(item) and set(item["replica"]["properties"]) == {
            "group",
            "ordinal",
            "replicas",
        }
        assert fields["replicas"]["additionalProperties"]["type"] == "integer"


def test_a_final_checkpoint_says_so_only_once_completed() -> None:
    """``status.final``: the stack was not resumed after this checkpoint (spec.final, or a participant terminating at
    prepare made it final); a failed one was aborted, so the stack did resume: not final."""

    def status(completed: bool, final: bool) -> dict[str, object]:
        result = TransactionResult(
            kind=TransactionKind.CHECKPOINT,
            checkpoint_id="ck",
            location="s3://b/p",
            status=TransactionStatus.COMPLETED if completed else TransactionStatus.FAILED,
            phase=TransactionPhase.COMPLETED if completed else TransactionPhase.FAILED,
            final=final,
        )
        return result_status(result, generation=1)

    assert status(completed=True, final=True)["final"] is True
    assert "final" not in status(completed=True, final=False) and "final" not in status(completed=False, final=True)
    schema = yaml.safe_load((CRDS / "checkpoints.yaml").read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["status"]["properties"]["final"]["type"] == "boolean"
