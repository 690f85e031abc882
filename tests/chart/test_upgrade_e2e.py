"""`helm upgrade` with upgradeCheckpoint on the emulated cluster: the pre-upgrade hook takes a Checkpoint (and
the upgrade waits for it), the upgrade replaces every server pod, the post-upgrade hook restores the checkpoint
into the new pods once they are ready; a live session continues as attempt 1 in its new process. (The CRD upgrade
path: tests/chart/test_crd_upgrade_e2e.py.)

Helm builds hook objects with OpenAPI validation even when told to skip it, and the emulator serves no
OpenAPI document; so this test plays Helm's part for the hooks: it renders them for the new revision, runs
`helm upgrade` without hooks, and applies each hook in Helm's order (weight, then kind), waiting for the Jobs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from tests.chart.cluster import Cluster
from tests.chart.test_helm_install import helm_call

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]

helm = pytest.importorskip("helm_python")

VALUES = {
    "servers": [{"name": "counter", "server": "counter", "role": "resources"}],
    "rollouts": {"enabled": False},
    "upgradeCheckpoint": {"enabled": True, "prepareTimeoutSeconds": 20, "timeoutSeconds": 90},
}
POD = "gym-gym-checkpoint-counter-0"


def hooks(helm_chart: Any, values: dict[str, Any], revision: int, phase: str) -> list[dict[str, Any]]:
    """The chart's hook objects for ``phase`` ('pre-upgrade' or 'post-upgrade'), in the order Helm runs them."""
    files = helm_chart.render(values, name="gym", namespace="default", revision=revision, is_upgrade=True)
    docs = [
        doc
        for path, text in files.items()
        if not path.endswith(".txt")
        for doc in yaml.safe_load_all(text)
        if isinstance(doc, dict)
    ]
    found = [doc for doc in docs if phase in doc["metadata"].get("annotations", {}).get("helm.sh/hook", "").split(",")]
    return sorted(
        found, key=lambda d: (int(d["metadata"]["annotations"].get("helm.sh/hook-weight", "0")), d["kind"] == "Job")
    )


def run_hooks(kubectl: Any, cluster: Cluster, objects: list[dict[str, Any]], timeout_s: float = 240) -> None:
    """Create each hook (deleting an earlier one: before-hook-creation) and wait for every Job to complete; then, as
    Helm's execHook does once every hook of the phase succeeded, delete those whose policy says hook-succeeded."""
    for obj in objects:
        kind, name = obj["kind"].lower(), obj["metadata"]["name"]
        kubectl("delete", kind, name, "--ignore-not-found=true")
        kubectl("apply", "-f", "-", input=json.dumps(obj))
        if obj["kind"] != "Job":
            continue
        deadline = time.monotonic() + timeout_s
        while True:
            conditions = (
                json.loads(kubectl("get", "job", name, "-o", "json").stdout).get("status", {}).get("conditions", [])
            )
            done = {c["type"] for c in conditions if c["status"] == "True"}
            if "Complete" in done:
                break
            assert "Failed" not in done and time.monotonic() < deadline, cluster.job_log(name)
            time.sleep(0.5)
    for obj in reversed(objects):
        if "hook-succeeded" in obj["metadata"]["annotations"].get("helm.sh/hook-delete-policy", "").split(","):
            kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found=true")


def test_upgrade_checkpoints_replaces_pods_and_restores(
    kemu: Any, kubectl: Any, helm_chart: Any, tmp_path: Path
) -> None:
    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace="default")
    try:
        with Cluster(kemu, tmp_path / "cluster") as cluster:
            assert helm_call(cfg, "helm_install", "gym", VALUES, timeout_seconds=60)["status"] == "deployed"
            cluster.wait_ready(timeout_s=180)
            assert not [name for name in cluster.pods if "upgrade" in name]  # hooks run on upgrades only
            url = cluster.local_url(POD)
            with httpx.Client(base_url=url) as http:
                http.post("/seed_session", json={"start": 41}, headers={"x-ng-rollout-id": "r1"}).raise_for_status()
                cookies = dict(http.cookies)
            old_pid = cluster.pods[POD].procs[0].pid

            new_values = {**VALUES, "serverDefaults": {"logLevel": "debug"}}
            pre, post = (hooks(helm_chart, new_values, 2, phase) for phase in ("pre-upgrade", "post-upgrade"))
            assert [(d["kind"], d["metadata"]["name"]) for d in pre][-1] == ("Job", "gym-gym-checkpoint-pre-upgrade")
            run_hooks(kubectl, cluster, pre)
            assert cluster.pods[POD].procs[0].pid == old_pid  # nothing replaced yet: the checkpoint came first
            upgraded = helm_call(cfg, "helm_upgrade", "gym", new_values, timeout_seconds=60, disable_hooks=True)
            assert upgraded["status"] == "deployed" and upgraded["revision"] == 2
            run_hooks(kubectl, cluster, post)

            checkpoint = json.loads(kubectl("get", "checkpoint", "gym-gym-checkpoint-upgrade-r2", "-o", "json").stdout)
            assert checkpoint["status"]["phase"] == "Completed" and checkpoint["status"]["participantCount"] == 1
            assert checkpoint["metadata"]["labels"] == {
                "gym-checkpoint.dev/release": "gym",  # (not the label Argo CD 2.x prunes by)
                "gym-checkpoint.dev/created-by": "upgrade-hook",
                "velero.io/exclude-from-backup": "true",  # (the operator's: never backed up and replayed)
            }
            # nothing of the hooks is left once the upgrade succeeded (so nothing survives `helm uninstall`)
            for kind in ("job", "serviceaccount", "role", "rolebinding"):
                left = kubectl("get", kind, "-l", "app.kubernetes.io/component=upgrade-hook", "-o", "name").stdout
                assert left.strip() == "", left
            restore = json.loads(kubectl("get", "restore", "gym-gym-checkpoint-upgrade-r2", "-o", "json").stdout)
            assert restore["status"]["phase"] == "Completed" and restore["status"]["restoredEpisodes"] == 1
            assert restore["spec"]["checkpointRef"] == {"name": "gym-gym-checkpoint-upgrade-r2"}
            # the pod was replaced by the upgrade (the revision annotation changed its template)
            pod = json.loads(kubectl("get", "pod", POD, "-o", "json").stdout)
            assert pod["metadata"]["annotations"]["gym-checkpoint.dev/release-revision"] == "2"
            assert cluster.pods[POD].procs[0].pid != old_pid
            with httpx.Client(base_url=cluster.local_url(POD), cookies=cookies) as http:
                stale = http.post("/increment", json={"by": 1}, headers={"x-ng-rollout-id": "r1", "x-ng-attempt": "0"})
                assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"
                again = http.post("/increment", json={"by": 1}, headers={"x-ng-rollout-id": "r1", "x-ng-attempt": "1"})
                assert again.json() == {"output": 42}
            assert "Checkpoint gym-gym-checkpoint-upgrade-r2: Completed" in cluster.job_log(
                "gym-gym-checkpoint-pre-upgrade"
            )
            assert "Restore gym-gym-checkpoint-upgrade-r2: Completed" in cluster.job_log(
                "gym-gym-checkpoint-post-upgrade"
            )
            assert not cluster.errors, cluster.errors
    finally:
        cfg.close()
