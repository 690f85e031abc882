"""`helm upgrade` with upgradeCheckpoint and 3 replicas per server on the emulated cluster, whose StatefulSet
controller (tests/chart/cluster.py) rolls one pod at a time from the highest ordinal and writes the StatefulSet's
status: a Restore made while the rollout is midway waits (WaitingForRollout) and runs once every pod is at the new
revision, into those pods only; every session continues there as attempt 1.

The pre-upgrade hook (the Checkpoint) is replayed as tests/chart/test_upgrade_e2e.py does. The Restore is made by the
test itself, the moment the first pod is replaced, with no wait of its own (the post-upgrade hook's --wait-pods would
hide the operator's wait, so upgradeCheckpoint.restoreAfterUpgrade is off): what is tested is that the operator never
restores into a stack that is still rolling. Then `helm rollback` with upgradeCheckpoint.checkpointBeforeRollback runs
the pre-rollback hook of the revision it returns to, which takes a Checkpoint. And the cluster's StatefulSet controller
under OnDelete: an upgrade replaces no pod, a deleted one comes back at the new revision.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.chart.cluster import REVISION_LABEL, Cluster
from tests.chart.test_helm_install import helm_call
from tests.chart.test_upgrade_e2e import hooks, run_hooks

from gym_services.base.affinity import replica_for

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]

helm = pytest.importorskip("helm_python")

REPLICAS = 3
STS = "gym-gym-checkpoint-counter"
PODS = [f"{STS}-{i}" for i in range(REPLICAS)]
VALUES = {
    "servers": [{"name": "counter", "server": "counter", "role": "resources", "replicas": REPLICAS}],
    "rollouts": {"enabled": False},
    "upgradeCheckpoint": {
        "enabled": True,
        "restoreAfterUpgrade": False,
        "checkpointBeforeRollback": True,
        "prepareTimeoutSeconds": 20,
        "timeoutSeconds": 90,
    },
}
CHECKPOINT = "gym-gym-checkpoint-upgrade-r2"


def rollout_ids() -> dict[int, str]:
    """One rollout id per ordinal, each hashing to that replica (as the collection server routes them)."""
    found: dict[int, str] = {}
    for i in range(1000):
        found.setdefault(replica_for(f"r{i}", REPLICAS), f"r{i}")
        if len(found) == REPLICAS:
            return found
    raise AssertionError("no rollout id for every replica")


def get(kubectl: Any, kind: str, name: str) -> dict[str, Any]:
    return json.loads(kubectl("get", kind, name, "-o", "json").stdout)


def wait_until(check: Any, what: str, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"no {what} in {timeout_s}s"
        time.sleep(0.3)


def rollback(cfg: Any, release: str, version: int) -> None:
    """`helm rollback RELEASE VERSION --no-hooks` (the test replays the hooks, as for upgrades)."""
    from helm_python import _native
    from helm_python.config import _opts

    _native.call_status(
        "helm_rollback", cfg._raw(), release, _opts(version=version, disable_hooks=True, timeout_seconds=60)
    )


def test_upgrade_with_replicas_restores_only_into_new_revision_pods(
    kemu: Any, kubectl: Any, helm_chart: Any, tmp_path: Path
) -> None:
    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace="default")
    try:
        with Cluster(kemu, tmp_path / "cluster") as cluster:
            assert helm_call(cfg, "helm_install", "gym", VALUES, timeout_seconds=60)["status"] == "deployed"
            cluster.wait_ready(timeout_s=180)
            sts = wait_until(
                lambda: (
                    (s := get(kubectl, "statefulset", STS)).get("status", {}).get("readyReplicas") == REPLICAS and s
                ),
                "settled StatefulSet status",
            )
            old_revision = sts["status"]["updateRevision"]
            assert sts["status"]["currentRevision"] == old_revision and sts["status"]["updatedReplicas"] == REPLICAS
            old_uids = {pod: get(kubectl, "pod", pod)["metadata"]["uid"] for pod in PODS}
            assert {get(kubectl, "pod", pod)["metadata"]["labels"][REVISION_LABEL] for pod in PODS} == {old_revision}

            # one live session on every replica, on the pod its rollout id hashes to
            ids, cookies = rollout_ids(), {}
            for ordinal, rollout in ids.items():
                with httpx.Client(base_url=cluster.local_url(PODS[ordinal])) as http:
                    http.post(
                        "/seed_session", json={"start": 10 * (ordinal + 1)}, headers={"x-ng-rollout-id": rollout}
                    ).raise_for_status()
                    cookies[ordinal] = dict(http.cookies)

            new_values = {**VALUES, "serverDefaults": {"logLevel": "debug"}}
            pre = hooks(helm_chart, new_values, 2, "pre-upgrade")
            assert not hooks(helm_chart, new_values, 2, "post-upgrade")  # restoreAfterUpgrade is off
            run_hooks(kubectl, cluster, pre)
            checkpoint = get(kubectl, "checkpoint", CHECKPOINT)["status"]
            assert checkpoint["phase"] == "Completed" and checkpoint["participantCount"] == REPLICAS, checkpoint

            cluster.roll_budget = 1  # the StatefulSet controller replaces the highest pod, then holds
            upgraded = helm_call(cfg, "helm_upgrade", "gym", new_values, timeout_seconds=60, disable_hooks=True)
            assert upgraded["status"] == "deployed" and upgraded["revision"] == 2
            midway = wait_until(
                lambda: (
                    (s := get(kubectl, "statefulset", STS)["status"]).get("updatedReplicas") == 1
                    and s.get("readyReplicas") == REPLICAS
                    and s
                ),
                "first pod at the new revision",
            )
            new_revision = midway["updateRevision"]
            assert new_revision != old_revision and midway["currentRevision"] == old_revision
            labels = {pod: get(kubectl, "pod", pod)["metadata"]["labels"][REVISION_LABEL] for pod in PODS}
            assert labels == {PODS[0]: old_revision, PODS[1]: old_revision, PODS[2]: new_revision}

            # a Restore made now waits for the rollout instead of restoring into pods about to be replaced
            kubectl(
                "apply",
                "-f",
                "-",
                input=json.dumps(
                    {
                        "apiVersion": "gym-checkpoint.dev/v1alpha1",
                        "kind": "Restore",
                        "metadata": {"name": "after-upgrade"},
                        "spec": {"release": "gym", "checkpointRef": {"name": CHECKPOINT}},
                    }
                ),
            )

            def decided() -> bool:
                status = get(kubectl, "restore", "after-upgrade").get("status") or {}
                return status.get("reason") == "WaitingForRollout" or status.get("phase") in ("Completed", "Failed")

            wait_until(decided, "the Restore's first decision")
            waiting = get(kubectl, "restore", "after-upgrade")["status"]
            assert (waiting["phase"], waiting["reason"]) == ("Pending", "WaitingForRollout"), waiting
            assert f"StatefulSet {STS}: rolling out revision {new_revision}, 1 of 3 pods updated" in waiting["message"]

            cluster.roll_budget = None  # the rollout goes on: pod 1, then pod 0
            kubectl(
                "wait",
                "--for=jsonpath={.status.phase}=Completed",
                "restore/after-upgrade",
                "--timeout=180s",
                timeout=190,
            )
            restored = get(kubectl, "restore", "after-upgrade")["status"]
            assert restored["participantCount"] == REPLICAS and restored["replicas"] == {"counter": REPLICAS}
            assert restored["restoredEpisodes"] == REPLICAS, restored
            settled = get(kubectl, "statefulset", STS)["status"]
            assert settled["currentRevision"] == settled["updateRevision"] == new_revision
            assert settled["updatedReplicas"] == settled["readyReplicas"] == REPLICAS
            for ordinal, rollout in ids.items():
                pod = get(kubectl, "pod", PODS[ordinal])
                assert pod["metadata"]["labels"][REVISION_LABEL] == new_revision
                assert pod["metadata"]["uid"] != old_uids[PODS[ordinal]]
                # the restored session lives in this (new) pod, continued as attempt 1
                with httpx.Client(base_url=cluster.local_url(PODS[ordinal]), cookies=cookies[ordinal]) as http:
                    stale = http.post(
                        "/increment", json={"by": 1}, headers={"x-ng-rollout-id": rollout, "x-ng-attempt": "0"}
                    )
                    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"
                    again = http.post(
                        "/increment", json={"by": 1}, headers={"x-ng-rollout-id": rollout, "x-ng-attempt": "1"}
                    )
                    assert again.json() == {"output": 10 * (ordinal + 1) + 1}, (PODS[ordinal], again.text)

            # `helm rollback` to revision 1 runs that revision's pre-rollback hook first: a Checkpoint of its own name
            pre_rollback = hooks(helm_chart, VALUES, 1, "pre-rollback")
            assert [(d["kind"], d["metadata"]["name"]) for d in pre_rollback][-1] == (
                "Job",
                "gym-gym-checkpoint-pre-rollback",
            )
            run_hooks(kubectl, cluster, pre_rollback)
            rollback(cfg, "gym", version=1)
            release = cfg.status("gym")
            assert release["revision"] == 3 and release["status"] == "deployed", release
            series = json.loads(
                kubectl("get", "checkpoints", "-l", "gym-checkpoint.dev/created-by=upgrade-hook", "-o", "json").stdout
            )["items"]
            taken = [c for c in series if c["metadata"]["name"].startswith("gym-gym-checkpoint-rollback-")]
            assert len(taken) == 1, [c["metadata"]["name"] for c in series]
            assert taken[0]["status"]["phase"] == "Completed" and taken[0]["status"]["participantCount"] == REPLICAS
            assert f"Checkpoint {taken[0]['metadata']['name']}: Completed" in cluster.job_log(
                "gym-gym-checkpoint-pre-rollback"
            )
            assert not cluster.errors, cluster.errors
    finally:
        cfg.close()


def test_on_delete_statefulsets_keep_their_pods_until_deleted(kemu: Any, kubectl: Any, tmp_path: Path) -> None:
    """The cluster's StatefulSet controller under `updateStrategy: OnDelete`: `helm upgrade` changes the update
    revision and no pod; a pod deleted by hand comes back at the new revision, and the status counts it."""
    values = {
        "servers": [{"name": "counter", "server": "counter", "role": "resources", "replicas": 2}],
        "rollouts": {"enabled": False},
        "serverDefaults": {"updateStrategy": "OnDelete"},
    }
    pods = [f"{STS}-{i}" for i in range(2)]
    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace="default")
    try:
        with Cluster(kemu, tmp_path / "cluster") as cluster:
            assert helm_call(cfg, "helm_install", "gym", values, timeout_seconds=60)["status"] == "deployed"
            cluster.wait_ready(timeout_s=180)
            old = wait_until(
                lambda: (s := get(kubectl, "statefulset", STS).get("status") or {}).get("readyReplicas") == 2 and s,
                "settled StatefulSet status",
            )
            uids = {pod: get(kubectl, "pod", pod)["metadata"]["uid"] for pod in pods}
            new_values = {**values, "serverDefaults": {"updateStrategy": "OnDelete", "logLevel": "debug"}}
            assert helm_call(cfg, "helm_upgrade", "gym", new_values, timeout_seconds=60)["revision"] == 2
            status = wait_until(
                lambda: (
                    (s := get(kubectl, "statefulset", STS)["status"])["updateRevision"] != old["updateRevision"] and s
                ),
                "the new update revision",
            )
            assert status["currentRevision"] == old["updateRevision"] and status["updatedReplicas"] == 0, status
            assert {pod: get(kubectl, "pod", pod)["metadata"]["uid"] for pod in pods} == uids  # none replaced

            kubectl("delete", "pod", pods[0])
            status = wait_until(
                lambda: (
                    (s := get(kubectl, "statefulset", STS)["status"])["updatedReplicas"] == 1
                    and s["readyReplicas"] == 2
                    and s
                ),
                "the deleted pod back at the new revision",
            )
            assert status["currentRevision"] == old["updateRevision"], status  # not every pod is at the new one
            first, second = (get(kubectl, "pod", pod)["metadata"] for pod in pods)
            assert first["uid"] != uids[pods[0]] and first["labels"][REVISION_LABEL] == status["updateRevision"]
            assert second["uid"] == uids[pods[1]] and second["labels"][REVISION_LABEL] == old["updateRevision"]
            assert not cluster.errors, cluster.errors
    finally:
        cfg.close()
