"""One mechanism, on the emulated cluster: a CheckpointSchedule's checkpoints, a preemption that arrives during a
scheduled checkpoint (the termination checkpoint follows it, never two at once), and `helm upgrade`, which replaces
every server pod: a termination like any other, checkpointed by the operator and restored by itself, with no upgrade
hook (the chart has none)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chart.cluster import Cluster
from tests.chart.termination import (
    CREATED_BY,
    PODS,
    VALUES,
    Sessions,
    automatic_restores,
    install,
    items,
    named,
    phase,
    terminations,
    wait_for,
)

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]

ENDED = ("Completed", "Failed")


def schedule(kubectl: Any, name: str, **spec: Any) -> None:
    body = {
        "apiVersion": "gym-checkpoint.dev/v1alpha1",
        "kind": "CheckpointSchedule",
        "metadata": {"name": name},
        "spec": {"release": "gym", **spec},
    }
    kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def restored_from(kubectl: Any, checkpoint: str, cluster: Cluster, before: set[str]) -> dict[str, Any]:
    """The automatic Restore (made after ``before``) of ``checkpoint``, once Completed."""

    def done() -> dict[str, Any] | None:
        new = {n: r for n, r in automatic_restores(kubectl).items() if n not in before}
        ours = [r for r in new.values() if r["spec"]["checkpointRef"]["name"] == checkpoint and phase(r) in ENDED]
        return ours[0] if ours else None

    restore = wait_for(done, 120, f"the automatic Restore of {checkpoint}", cluster)
    assert phase(restore) == "Completed", restore["status"]
    return restore


def test_a_preemption_during_a_scheduled_checkpoint_and_helm_upgrade_are_terminations(
    kemu: Any, kubectl: Any, tmp_path: Path
) -> None:
    with Cluster(kemu, tmp_path / "cluster") as cluster:
        assert install(kemu)["status"] == "deployed"
        cluster.wait_ready(timeout_s=180)
        sessions = Sessions(cluster)
        sessions.seed({PODS[0]: 100, PODS[1]: 200})

        # a schedule: its first run 10 s after its creation; a pod is preempted the moment that Checkpoint exists
        schedule(kubectl, "often", schedule="@every 10s", keep=2, template={"prepareTimeoutSeconds": 5})
        scheduled = wait_for(
            lambda: named(items(kubectl, "checkpoints", "gym-checkpoint.dev/schedule=often")), 30, "a run", cluster
        )
        kubectl("delete", "pod", PODS[0], "--wait=false")
        (first,) = scheduled
        (termination,) = wait_for(lambda: terminations(kubectl), 20, "the termination Checkpoint", cluster)
        wait_for(
            lambda: (
                phase(named(items(kubectl, "checkpoints"))[first]) in ENDED
                and phase(terminations(kubectl)[termination]) in ENDED
            ),
            60,
            "both to end",
            cluster,
        )
        ran = named(items(kubectl, "checkpoints"))
        final, regular = ran[termination]["status"], ran[first]["status"]
        # never two at once: the termination checkpoint followed the scheduled one, or that one, not started yet,
        # gave way to it; or the scheduled one had started when the server was signalled: it took that server's
        # last state as final (the server then left), and the stack resumes from it
        if final["phase"] == "Completed":
            assert regular["phase"] == "Completed" or regular["reason"] == "Superseded", regular
            assert regular["phase"] != "Completed" or regular["completionTime"] <= final["completionTime"]
            resumes_from = termination
        else:
            said = {k: (v["status"].get("reason"), v["status"].get("message")) for k, v in ran.items()}
            assert final["reason"] == "NothingNewToSave" and regular["phase"] == "Completed", said
            assert regular.get("final") is True, regular  # it took the terminating server's last state
            assert f"the stack resumes from Checkpoint {first}" in final["message"], final
            resumes_from = first
        kubectl("patch", "checkpointschedule", "often", "--type=merge", "-p", json.dumps({"spec": {"paused": True}}))
        restore = restored_from(kubectl, resumes_from, cluster, set())
        sessions.resumed(attempt=restore["status"]["attempt"])
        status = json.loads(kubectl("get", "checkpointschedule", "often", "-o", "json").stdout)["status"]
        assert status["lastCheckpoint"].startswith("often-") and status["phase"] in ("Enabled", "Paused")
        table = kubectl("get", "checkpointschedules").stdout.splitlines()
        assert table[0].split() == ["NAME", "SCHEDULE", "PHASE", "KEEP", "LAST-SUCCESS", "NEXT", "AGE"], table
        wait_for(
            lambda: (
                json.loads(kubectl("get", "checkpointschedule", "often", "-o", "json").stdout)["status"]["phase"]
                == "Paused"
            ),
            10,
            "the schedule to pause",
        )

        # helm upgrade: every server pod's template changes, so the StatefulSets replace them all. The operator
        # checkpoints the stack as they go, and restores it into the new pods; there is no upgrade hook.
        before = set(automatic_restores(kubectl))
        old = set(terminations(kubectl))
        sessions.increment()
        started = time.monotonic()
        upgraded = install(kemu, {**VALUES, "serverDefaults": {"logLevel": "debug"}}, upgrade=True)
        assert upgraded["status"] == "deployed" and upgraded["revision"] == 2
        (upgrade,) = wait_for(lambda: set(terminations(kubectl)) - old, 60, "the upgrade's termination", cluster)
        restore = restored_from(kubectl, upgrade, cluster, before)
        assert terminations(kubectl)[upgrade]["status"]["participantCount"] == 2
        pods = [json.loads(kubectl("get", "pod", pod, "-o", "json").stdout) for pod in PODS]
        revisions = {pod["metadata"]["labels"]["controller-revision-hash"] for pod in pods}
        updates = {s["status"]["updateRevision"] for s in items(kubectl, "statefulsets")}
        assert revisions <= updates  # restored into the new pods, both replaced
        sessions.resumed(attempt=restore["status"]["attempt"])
        print(f"\nUPGRADE upgrade->resumed {time.monotonic() - started:.1f}s")
        assert not items(kubectl, "jobs", "app.kubernetes.io/component=upgrade-hook")
        assert {c["metadata"]["labels"][CREATED_BY] for c in items(kubectl, "checkpoints")} <= {
            "schedule",
            "termination",
        }
        assert not cluster.errors, cluster.errors
