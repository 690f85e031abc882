"""One vocabulary on both sides of the status write: what the coordinator and the operator report
is what both CRDs accept.

kube-apiserver refuses a status patch whose ``phase`` is not in the CRD's enum (422), and the
operator writes phases from the coordinator's :class:`TransactionPhase`; so every member must
validate against both CRDs, and so must every status document ``gym_operator.status`` builds
(roles included: they come from the control protocol's :class:`Role`). Unknown status fields are
not checked here (a real API server prunes them; the Kubernetes work owns that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gym_services.control.protocol import Role
from gym_services.coordination.transaction import (
    BlockerInfo,
    ParticipantSummary,
    TransactionKind,
    TransactionPhase,
    TransactionResult,
    TransactionStatus,
)

CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"
KINDS = ("checkpoints", "restores")


def status_schema(kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / f"{kind}.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("phase", list(TransactionPhase))
def test_every_transaction_phase_is_a_crd_phase(kind: str, phase: TransactionPhase) -> None:
    jsonschema.validate(phase.value, status_schema(kind)["properties"]["phase"])


@pytest.mark.parametrize("kind", KINDS)
def test_crd_phases_are_exactly_the_transaction_phases(kind: str) -> None:
    assert set(status_schema(kind)["properties"]["phase"]["enum"]) == {p.value for p in TransactionPhase}


@pytest.mark.parametrize("kind", KINDS)
def test_crd_roles_are_exactly_the_protocol_roles(kind: str) -> None:
    role = status_schema(kind)["properties"]["participants"]["items"]["properties"]["role"]
    assert set(role["enum"]) == {r.value for r in Role}


def result(kind: TransactionKind, status: TransactionStatus) -> TransactionResult:
    return TransactionResult(
        kind=kind,
        checkpoint_id="ck-1",
        location="s3://bucket/prefix",
        status=status,
        phase=TransactionPhase.COMPLETED if status is TransactionStatus.COMPLETED else TransactionPhase.CAPTURING,
        participants=[ParticipantSummary(participant_id=f"p-{r.value}", role=r, records=1, bytes=2) for r in Role],
        blockers=[BlockerInfo(participant="p-agent", kind="episode", id="r1", detail="tool call")],
        timings={"prepare": 0.1, "pause": 0.2},
        pause_s=0.2,
        records=5,
        bytes=10,
        episodes={"r1": 1},
        restore_id="rs-1" if kind is TransactionKind.RESTORE else None,
        error=None if status is TransactionStatus.COMPLETED else "disk on fire",
    )


def documents(kind: str) -> list[tuple[str, dict[str, Any]]]:
    from gym_operator import status

    docs = [
        (f"progress {p}", status.progress_status(p, p.lower(), 1, startTime=status.now()))
        for p in TransactionPhase
        if not p.final
    ]
    docs.append(("pending", status.pending_status("WaitingForStack", "waiting", 1)))
    docs.append(("failed", status.failed_status("InvalidSpec", "bad spec", 1, checkpointId="ck-1")))
    transaction = TransactionKind.CHECKPOINT if kind == "checkpoints" else TransactionKind.RESTORE
    for outcome in TransactionStatus:
        docs.append((f"{transaction} {outcome}", status.result_status(result(transaction, outcome), 1)))
    return docs


@pytest.mark.parametrize("kind", KINDS)
def test_every_status_the_operator_writes_validates(kind: str) -> None:
    pytest.importorskip("kopf")
    schema = status_schema(kind)
    for name, doc in documents(kind):
        errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
        assert not errors, (kind, name, errors)
