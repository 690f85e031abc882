"""Velero and the release's resources (gym_operator.controllers.backups): they carry velero.io/exclude-from-backup, so
a backup of the namespace leaves them out; and one a Velero restore re-created anyway is never run again - with a
completed status it is left as it is, without one it ends Failed (RestoredByVelero). Before, a Restore restored by
Velero without its status ran again: the stack went back to an old checkpoint."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from tests.operator.harness import Operators, resource, wait_for

pytestmark = pytest.mark.k8s

RESTORED = {"velero.io/restore-name": "nightly-20261205", "velero.io/backup-name": "nightly"}


@pytest.fixture
def kemu(kemu_shared: Any) -> Any:
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


def create(
    kubectl: Any, namespace: str, kind: str, name: str, labels: dict[str, str], status: Any, **spec: Any
) -> None:
    doc = resource(kind, name, **spec)
    doc["metadata"]["labels"] = labels
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
    if status is not None:
        patch = json.dumps({"status": status})
        kubectl("patch", kind.lower(), name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch)


def get(kubectl: Any, namespace: str, kind: str, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout))


def test_resources_are_kept_out_of_backups_and_one_a_velero_restore_recreated_never_runs(
    operators: Operators, kubectl: Any, namespace: str
) -> None:
    done = {"phase": "Completed", "reason": "Completed", "checkpointId": "old-0000abcd", "location": "s3://gone/ckpts"}
    # what a Velero restore of the namespace re-creates, before (or while) the operator runs
    create(kubectl, namespace, "Checkpoint", "old", RESTORED, done)
    create(kubectl, namespace, "Restore", "old-restore", RESTORED, {**done, "restoredEpisodes": 3}, checkpointId="x")
    create(kubectl, namespace, "Restore", "bare-restore", RESTORED, None, checkpointId="old-0000abcd")
    before = {
        name: get(kubectl, namespace, kind, name) for kind, name in (("checkpoint", "old"), ("restore", "old-restore"))
    }
    operators.start(namespace)
    create(kubectl, namespace, "Checkpoint", "fresh", {}, None)  # one a user makes: labelled, and it runs
    wait_for(
        lambda: get(kubectl, namespace, "restore", "bare-restore").get("status", {}).get("phase") == "Failed",
        what="the re-created Restore to end",
    )
    bare = get(kubectl, namespace, "restore", "bare-restore")["status"]
    assert bare["reason"] == "RestoredByVelero" and "nightly-20261205" in bare["message"], bare
    wait_for(
        lambda: get(kubectl, namespace, "checkpoint", "fresh").get("status", {}).get("phase") == "Failed",
        what="the user's Checkpoint to run (and fail: no pods)",
    )
    assert get(kubectl, namespace, "checkpoint", "fresh")["status"]["reason"] == "NoParticipants"
    for kind, name in (("checkpoint", "old"), ("restore", "old-restore")):
        now = get(kubectl, namespace, kind, name)
        assert now["status"] == before[name]["status"], name  # never run again
    for kind, name in (
        ("checkpoint", "old"),
        ("restore", "old-restore"),
        ("restore", "bare-restore"),
        ("checkpoint", "fresh"),
    ):
        wait_for(
            lambda k=kind, n=name: (
                get(kubectl, namespace, k, n)["metadata"]["labels"].get("velero.io/exclude-from-backup") == "true"
            ),
            what=f"{name} to be kept out of backups",
        )
    reasons = [e["reason"] for e in json.loads(kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]]
    assert "TakenOver" not in reasons and "Preparing" not in reasons
