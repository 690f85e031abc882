"""A preemption with nobody watching, on the emulated cluster (tests/chart/cluster.py: the kubelet sends SIGTERM at
a pod's deletion and SIGKILL when its grace period ends): the chart's operator, under the chart's own RBAC, sees the
pod terminating and takes one final Checkpoint of the whole stack before the pod is killed; the pods come back fresh
and the operator restores them by itself; every session continues as attempt + 1. Then a second termination while
that automatic restore runs: whichever comes first, the stack ends restored, nothing published is empty, and every
session continues from where it was.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest
from tests.chart.cluster import Cluster
from tests.chart.termination import (
    PODS,
    Sessions,
    automatic_restores,
    events_of,
    gone,
    install,
    phase,
    server_log,
    terminations,
    wait_for,
)

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]


def stamp(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_deleted_pod_is_checkpointed_in_its_grace_period_and_the_stack_resumes_by_itself(
    kemu: Any, kubectl: Any, tmp_path: Path
) -> None:
    workdir = tmp_path / "cluster"
    with Cluster(kemu, workdir) as cluster:
        assert install(kemu)["status"] == "deployed"
        cluster.wait_ready(timeout_s=180)
        sessions = Sessions(cluster)
        sessions.seed({PODS[0]: 41, PODS[1]: 7})
        sessions.increment()

        # a preemption: the pod is deleted with its grace period (40 s); no checkpoint command is typed
        victim = json.loads(kubectl("get", "pod", PODS[0], "-o", "json").stdout)
        kubectl("delete", "pod", PODS[0], "--wait=false")
        deleted_at = time.monotonic()
        kill_at = stamp(
            json.loads(kubectl("get", "pod", PODS[0], "-o", "json").stdout)["metadata"]["deletionTimestamp"]
        )
        found = wait_for(lambda: terminations(kubectl), 20, "a termination Checkpoint", cluster)
        (name,) = found
        assert name.startswith("gym-termination-")
        wait_for(lambda: phase(terminations(kubectl)[name]) in ("Completed", "Failed"), 30, "its end", cluster)
        checkpoint = terminations(kubectl)[name]
        assert phase(checkpoint) == "Completed", checkpoint["status"]
        completed_after = time.monotonic() - deleted_at
        spec, status = checkpoint["spec"], checkpoint["status"]
        # the whole stack (both servers, though one pod went), final, inside the deadline the pod's grace gave
        assert spec["final"] is True and status["final"] is True and status["participantCount"] == 2
        assert stamp(spec["deadline"]) == kill_at - dt.timedelta(seconds=10)  # (termination.marginSeconds)
        assert stamp(status["completionTime"]) <= stamp(spec["deadline"])
        # the deleted pod's server left on its own, having written its part; it was never SIGKILLed
        wait_for(lambda: gone(kubectl, PODS[0], victim["metadata"]["uid"]), 30, "the pod to go", cluster)
        gone_after = time.monotonic() - deleted_at
        assert gone_after < 30  # (its grace period is 40 s: it went because it was done, not killed)
        assert '"outcome": "final_persisted"' in server_log(cluster, workdir, PODS[0]).replace("'", '"')
        reasons = [reason for reason, _ in events_of(kubectl, PODS[0])]
        assert "TerminationCheckpoint" in reasons

        # the pods come back fresh (the deleted one made again, the other restarted in place once its lease ran
        # out), and the operator restores the whole stack from that checkpoint
        restores = wait_for(lambda: automatic_restores(kubectl), 90, "the automatic Restore", cluster)
        (restore_name,) = restores
        wait_for(lambda: phase(automatic_restores(kubectl)[restore_name]) == "Completed", 60, "it to complete", cluster)
        restore = automatic_restores(kubectl)[restore_name]
        assert restore["spec"]["checkpointRef"] == {"name": name}
        assert restore["status"]["attempt"] == 1 and restore["status"]["restoredEpisodes"] == 2
        assert cluster.pods[PODS[1]].restarts == 1  # the other server held the final checkpoint, then restarted
        resumed = [m for r, m in events_of(kubectl, restore_name) if r == "Resumed"]
        assert resumed and status["checkpointId"] in resumed[0] and name in resumed[0]
        sessions.resumed(attempt=1)
        print(f"\nTERMINATION signal->completed {completed_after:.1f}s, pod gone after {gone_after:.1f}s")

        # a second termination while the automatic restore of it runs: delete a pod the moment the Restore exists
        sessions.increment()
        before = set(automatic_restores(kubectl))
        other = json.loads(kubectl("get", "pod", PODS[1], "-o", "json").stdout)
        kubectl("delete", "pod", PODS[1], "--wait=false")  # (a second wave: it terminates, then the restore)
        wait_for(lambda: gone(kubectl, PODS[1], other["metadata"]["uid"]), 60, "the pod to go", cluster)
        cluster.wait_ready(timeout_s=120)
        second = wait_for(lambda: set(automatic_restores(kubectl)) - before, 90, "the next Restore", cluster)
        kubectl("delete", "pod", PODS[0], "--wait=false")  # ... and a termination while that one runs
        wait_for(
            lambda: (
                all(phase(r) in ("Completed", "Failed") for r in automatic_restores(kubectl).values())
                and not [c for c in terminations(kubectl).values() if phase(c) not in ("Completed", "Failed")]
            ),
            120,
            "every restore and checkpoint to end",
            cluster,
        )
        cluster.wait_ready(timeout_s=120)

        # whatever came first, the stack ends restored from the newest termination checkpoint, which holds every
        # session (the restore came first: the checkpoint followed it and was restored in turn; the termination came
        # first: the restore waited for the pod to be replaced, and no checkpoint was taken of the fresh stack)
        def settled() -> dict[str, Any] | None:
            restores, checkpoints = automatic_restores(kubectl), terminations(kubectl)
            if any(phase(o) not in ("Completed", "Failed") for o in [*restores.values(), *checkpoints.values()]):
                return None
            done = [r for r in restores.values() if phase(r) == "Completed"]
            newest = max(done, key=lambda r: (r["status"]["completionTime"], r["metadata"]["name"]))
            taken = [c for c in checkpoints.values() if phase(c) == "Completed"]
            last_taken = max(taken, key=lambda c: (c["status"]["completionTime"], c["metadata"]["name"]))
            ours = newest["spec"]["checkpointRef"]["name"] == last_taken["metadata"]["name"]
            return newest if ours and newest["metadata"]["name"] not in before else None

        last = wait_for(settled, 150, "the stack restored after the last termination", cluster)
        cluster.wait_ready(timeout_s=60)
        assert last["status"]["restoredEpisodes"] == 2, last["status"]
        for checkpoint in terminations(kubectl).values():
            if phase(checkpoint) == "Completed":  # never an empty stack's: each server held its session
                held = [p["episodes"] for p in checkpoint["status"]["participants"]]
                assert held == [1, 1], checkpoint["status"]
        sessions.resumed(attempt=last["status"]["attempt"])
        assert second and not cluster.errors, cluster.errors
