"""The release going away (gym_operator.controllers.release, gym_operator.uninstall), as on a cluster: real Helm
installs the chart into the emulator, whose emulated controllers and kubelet (tests/chart/cluster.py) run the
operator's pods and the hooks' Jobs as processes under the chart's own ServiceAccounts and Roles; `helm uninstall`
deletes in Helm's real order (the Deployment, RoleBinding, Role and ServiceAccount in one pass, the pod's SIGTERM
after). The emulator holds namespaces and CRDs until the finalizers of what is inside are removed
(tests/k8s/test_deletion.py), as kube-apiserver's controllers do. Each test has an emulator of its own (it deletes
CRDs or a namespace).

The order they rely on (docs/operations/guide.md, "Uninstall"): only a resource whose deletion needs the operator holds
its finalizer, and `helm uninstall`'s pre-delete hook makes the operator let go of those while its rights still
exist."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chart.cluster import Cluster
from tests.operator.harness import RELEASE, completed_earlier, finalizer_of, resource, wait_for

pytestmark = pytest.mark.k8s

helm = pytest.importorskip("helm_python")
from tests.chart.test_helm_install import helm_call  # noqa: E402

NS = "rl"


def values(store: Path) -> dict[str, Any]:
    """The smallest release: the operator (two replicas) and one server that takes no part in checkpoints."""
    return {
        "servers": [{"name": "inference-worker", "server": "inference_worker", "participant": False, "port": 8000}],
        "rollouts": {"enabled": False},
        "networkPolicy": {"enabled": False},
        "storage": {"embedded": {"enabled": False}, "location": f"file://{store}"},
        "operator": {
            "replicas": 2,
            "leaderElection": {"leaseDurationSeconds": 8, "renewDeadlineSeconds": 6, "retryPeriodSeconds": 1},
        },
        # the shortest termination the chart allows: a deleted server pod holds on for a termination checkpoint
        # for gracePeriodSeconds - marginSeconds (6 s, not the default 50 s) before it drains, and the namespace
        # goes only once it has
        "termination": {"gracePeriodSeconds": 15, "marginSeconds": 9},
    }


OPERATOR_SA = f"system:serviceaccount:{NS}:{RELEASE}-gym-checkpoint-operator"
HOOK_SA = f"system:serviceaccount:{NS}:{RELEASE}-gym-checkpoint-uninstall"


def install(kemu: Any, kubectl: Any, store: Path) -> Any:
    """The release installed (its hooks run), its operator leading; the Helm config (closed by the caller)."""
    kubectl("create", "namespace", NS)
    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace=NS)
    assert helm_call(cfg, "helm_install", RELEASE, values(store), timeout_seconds=120)["status"] == "deployed"
    wait_for(lambda: _lease(kubectl).get("holderIdentity"), timeout=90, what="an operator to lead")
    return cfg


def operator_logs(cluster: Cluster) -> str:
    """What every operator pod of the test wrote (their folders outlive the pods)."""
    return "\n".join(p.read_text(errors="replace") for p in sorted((cluster.workdir / "pods").glob("*operator*/*.log")))


def _lease(kubectl: Any) -> dict[str, Any]:
    found = kubectl("get", "lease", f"{RELEASE}-gym-checkpoint-operator", "-n", NS, "-o", "json", check=False)
    if found.returncode != 0:
        return {}
    record = json.loads(found.stdout)
    return {**record["spec"], "annotations": record["metadata"].get("annotations") or {}}


def resources(kubectl: Any, store: Path) -> None:
    """What a release has when it goes: a Checkpoint at rest (no finalizer), one whose `deletionPolicy: Delete` has
    stored objects (its operator's finalizer), and a Restore that failed (none)."""
    completed_earlier(kubectl, NS, "at-rest", location=f"file://{store}")
    completed_earlier(kubectl, NS, "with-data", location=f"file://{store}", deletionPolicy="Delete")
    kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(resource("Restore", "lost", checkpointId="nowhere-1")))
    wait_for(lambda: finalizers(kubectl, "checkpoint", "with-data") == [finalizer_of()], what="the finalizer")
    wait_for(
        lambda: kubectl("get", "restore", "lost", "-n", NS, "-o", "jsonpath={.status.phase}").stdout == "Failed",
        what="the Restore to fail (no pods)",
    )
    assert finalizers(kubectl, "checkpoint", "at-rest") == [] and finalizers(kubectl, "restore", "lost") == []


def finalizers(kubectl: Any, kind: str, name: str) -> list[str]:
    found = json.loads(kubectl("get", kind, name, "-n", NS, "-o", "json").stdout)
    return list(found["metadata"].get("finalizers") or [])


def refused(kemu: Any, user: str) -> list[dict[str, Any]]:
    return [e for e in kemu.audit(user=user) if e["code"] in (401, 403)]


def test_helm_uninstall_lets_go_of_every_finalizer_and_the_namespace_goes(
    kemu: Any, kubectl: Any, tmp_path: Path
) -> None:
    """`helm uninstall` with Checkpoints present: its pre-delete hook marks the operator's Kubernetes Lease, the leader
    steps down and takes its finalizer off the Checkpoint that held it (under its own Role, before Helm deletes it),
    no standby takes over, and the hook finds nothing left to do. Then the Checkpoints, the CRDs and the namespace
    are deleted at once, and the operator made no request its rights did not cover (none after they were gone).
    Before, the operator tried as it got SIGTERM, after Helm had deleted its ServiceAccount and Role: 401, taken for
    "not going away", and the Checkpoint, its CRD and the namespace stayed Terminating for ever."""
    store = tmp_path / "store"
    with Cluster(kemu, tmp_path / "cluster", namespace=NS) as cluster:
        cfg = install(kemu, kubectl, store)
        try:
            resources(kubectl, store)
            started = time.monotonic()
            cfg.uninstall(RELEASE, timeout=120)
            took = time.monotonic() - started
        finally:
            cfg.close()
        hook_log = cluster.job_log(f"{RELEASE}-gym-checkpoint-uninstall")
        said = operator_logs(cluster)
        assert took < 60, f"helm uninstall took {took:.0f}s"
        assert "the operator stepped down: no operator holds the Lease" in hook_log, hook_log
        assert "finalizers taken off here: none" in hook_log, hook_log  # the operator had done it
        assert finalizers(kubectl, "checkpoint", "with-data") == []
        reasons = [e["reason"] for e in json.loads(kubectl("get", "events", "-n", NS, "-o", "json").stdout)["items"]]
        assert "DataKept" in reasons
        assert not refused(kemu, OPERATOR_SA) and not refused(kemu, HOOK_SA)
        kubectl("delete", "checkpoints,restores", "--all", "-n", NS, "--timeout=15s", timeout=30)
        crds = ("checkpoints", "restores", "checkpointschedules", "checkpointstoragelocations")
        kubectl("delete", "crd", *(f"{crd}.gym-checkpoint.dev" for crd in crds), "--timeout=30s", timeout=40)
        # (inside the cluster: its kubelet deletes the uninstalled pods once their processes are gone, as a node's
        # does; without it they would stay Terminating for their whole grace period and hold the namespace)
        kubectl("delete", "namespace", NS, "--timeout=60s", timeout=70)
    assert "stepped down for the uninstall" in said, said[-3000:]
    assert "standing by: the release is being uninstalled" in said  # the standby never took over


def test_deleting_the_namespace_with_the_release_in_it(kemu: Any, kubectl: Any, tmp_path: Path) -> None:
    """The namespace is deleted with the release in it: its controller deletes everything at once, the operator's
    rights too, so the operator can no longer act. What holds no finalizer - a Checkpoint at rest, a failed Restore -
    goes with the namespace. The Checkpoint whose `deletionPolicy: Delete` holds the operator's finalizer stays,
    and the operator says why and how to finish in an error (before, `deletion_started` turned the refusal into
    "not going away" and said nothing); the command it names lets the namespace go. (`helm uninstall` first, whose
    hook lets go of everything, avoids it: the test above.)"""
    store = tmp_path / "store"
    with Cluster(kemu, tmp_path / "cluster", namespace=NS) as cluster:
        cfg = install(kemu, kubectl, store)
        cfg.close()
        resources(kubectl, store)
        kubectl("delete", "namespace", NS, "--wait=false")
        wait_for(lambda: kubectl("get", "checkpoint", "at-rest", "-n", NS, check=False).returncode != 0, what="it")
        assert kubectl("get", "restore", "lost", "-n", NS, check=False).returncode != 0
        assert finalizers(kubectl, "checkpoint", "with-data") == [finalizer_of()]
        wait_for(lambda: "finalizers stay" in operator_logs(cluster), timeout=60, what="the operator to say why")
        said = operator_logs(cluster)
        assert "401" in said or "403" in said, said[-3000:]
        remedy = f'kubectl patch checkpoint with-data -n {NS} --type=merge -p \'{{"metadata":{{"finalizers":null}}}}\''
        assert json.dumps(remedy)[1:-1] in said, said[-3000:]  # (the log is JSON: its quotes escaped)
        kubectl("patch", "checkpoint", "with-data", "-n", NS, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        # (the cluster's kubelet still runs: it deletes the pods once their processes are gone, as a node's does)
        kubectl("wait", "--for=delete", f"namespace/{NS}", "--timeout=60s", timeout=70)
