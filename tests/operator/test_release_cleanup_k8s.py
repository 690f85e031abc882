"""The release going away (gym_operator.controllers.release): `helm uninstall` followed by deleting the CRDs, and
deleting the namespace, complete within a minute. The emulator holds namespaces and CRDs until the finalizers of what
is inside them are removed, as kube-apiserver and its controllers do (tests/k8s/test_deletion.py); it used to purge
them, which hid the hang. Each test gets an emulator of its own (it deletes the CRDs, or a namespace with the
operator's Kubernetes Lease in it).

The order they rely on (docs/operations/guide.md, "Uninstall"): the operator holds its finalizer on a Checkpoint or
Restore while it may have work at its deletion; when it stops and its release is going away - its Deployment is
gone (`helm uninstall`) or its namespace is terminating - it takes its finalizers off every resource of the release
before it exits. So the CRDs and the namespace are deleted after the operator, never waiting for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.operator.harness import (
    GROUP,
    RELEASE,
    Operators,
    apply,
    chart_operator_identity,
    completed_earlier,
    finalized,
    own_by_statefulset,
    phase,
    resource,
    running,
    settle_statefulset,
    wait_for,
)

pytestmark = pytest.mark.k8s
DEPLOYMENT = f"{RELEASE}-gym-checkpoint-operator"


def test_helm_uninstall_then_deleting_the_crds_completes(operators: Operators, kubectl: Any) -> None:
    """`helm uninstall` deletes the operator's Deployment (its pod then gets SIGTERM), then `kubectl delete crd`:
    the operator saw its Deployment gone and took its finalizers off the release's resources as it stopped, so the
    CRDs go at once. Before, every Checkpoint kept the finalizer and the CRDs stayed Terminating for ever."""
    kubectl("create", "namespace", "apps")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": "apps"},
        "spec": {"selector": {"matchLabels": {"app": "op"}}, "template": {"metadata": {"labels": {"app": "op"}}}},
    }
    kubectl("apply", "-f", "-", input=json.dumps(deployment))
    proc = operators.start("apps", GYMCKPT_OPERATOR_DEPLOYMENT=DEPLOYMENT)
    completed_earlier(kubectl, "apps", "kept")
    # no pods: it fails, and its daemon stays (for spec.ttl) with the finalizer
    kubectl("apply", "-n", "apps", "-f", "-", input=yaml.safe_dump(resource("Checkpoint", "idle")))
    kubectl(
        "apply", "-n", "apps", "-f", "-",
        input=yaml.safe_dump(resource("Restore", "waiting", checkpointRef={"name": "pending-one"})),
    )  # fmt: skip
    for name in ("kept", "idle"):
        wait_for(lambda n=name: finalized(kubectl, "apps", "checkpoint", n), what=f"the finalizer on {name}")

    # a restart for an upgrade (the Deployment is still there) keeps every finalizer
    assert operators.stop(proc) == 0
    assert finalized(kubectl, "apps", "checkpoint", "kept") and finalized(kubectl, "apps", "checkpoint", "idle")
    proc = operators.start("apps", GYMCKPT_OPERATOR_DEPLOYMENT=DEPLOYMENT)

    kubectl("delete", "deployment", DEPLOYMENT, "-n", "apps")  # helm uninstall
    assert operators.stop(proc) == 0  # the kubelet stops the operator's pod
    crds = [f"checkpoints.{GROUP}", f"restores.{GROUP}", f"checkpointschedules.{GROUP}"]
    kubectl("delete", "crd", *crds, "--timeout=60s", timeout=70)
    assert kubectl("get", "crd", "-o", "name").stdout.strip() == ""
    assert "Deployment gymtest-gym-checkpoint-operator is gone" in operators.log.read_text()


def test_deleting_the_namespace_completes(operators: Operators, kemu: Any, kubectl: Any) -> None:
    """The namespace is deleted with the release in it: the namespace controller deletes the Checkpoints (their
    finalizers hold them) and the operator's pod (SIGTERM). A Checkpoint with `deletionPolicy: Delete` whose storage
    does not answer is being retried then; the operator sees its namespace terminating and lets every resource of
    the release go as it stops: the namespace is gone within a minute. Before, it stayed Terminating for ever."""
    kubectl("create", "namespace", "team")
    proc = operators.start("team")  # (the chart's env also names the Deployment; the namespace alone is enough)
    completed_earlier(kubectl, "team", "with-data", deletionPolicy="Delete")
    kubectl("apply", "-n", "team", "-f", "-", input=yaml.safe_dump(resource("Checkpoint", "later")))
    kubectl(
        "apply", "-n", "team", "-f", "-",
        input=yaml.safe_dump(resource("Restore", "waiting", checkpointRef={"name": "pending-one"})),
    )  # fmt: skip
    for name in ("with-data", "later"):
        wait_for(lambda n=name: finalized(kubectl, "team", "checkpoint", n), what=f"the finalizer on {name}")

    kubectl("delete", "namespace", "team", "--wait=false")
    wait_for(lambda: "(try 1 of 6)" in operators.log.read_text(), timeout=60, what="the data deletion to be retried")
    assert kubectl("get", "namespace", "team", "-o", "jsonpath={.status.phase}").stdout == "Terminating"
    assert operators.stop(proc) == 0
    kubectl("wait", "--for=delete", "namespace/team", "--timeout=60s", timeout=70)
    assert "namespace team is being deleted" in operators.log.read_text()


def test_under_the_charts_role_an_uninstall_lets_go_of_a_restore_still_running(
    operators: Operators, kemu: Any, kubectl: Any, namespace: str, tmp_path: Path
) -> None:
    """The operator under the chart's own Role (its ServiceAccount's token and settings): a Restore whose daemon
    still runs at `helm uninstall` (it waits for the stack's StatefulSet to finish rolling out) carries kopf's
    finalizer. As the operator stops it takes the finalizers off with what the Role grants (list and patch), and the
    Restore and a Checkpoint can be deleted. Before, it read each resource again first (get, which the Role grants
    on Checkpoints only): 403, and the Restore kept its finalizer for ever (seen as a rare failure of the audit in
    test_releases_k8s.py, when a finished Restore's finalizer was still there at the stop)."""
    kubeconfig, settings, _role = chart_operator_identity(kemu, kubectl, namespace, tmp_path)
    assert settings["GYMCKPT_OPERATOR_DEPLOYMENT"] == DEPLOYMENT  # never created here: as after `helm uninstall`
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "counter-0",
            "labels": {
                "app.kubernetes.io/instance": RELEASE,
                "gym-checkpoint.dev/role": "resources",
                "gym-checkpoint.dev/participant": "counter",
            },
            "annotations": {"gym-checkpoint.dev/control-port": "1"},  # never called: the Restore waits
        },
        "spec": {"containers": [{"name": "server", "image": "gym-checkpoint:test"}]},
    }
    kubectl("apply", "-f", "-", input=json.dumps(pod))
    running(kubectl, "counter-0")
    own_by_statefulset(kubectl, "counter-0", "counter", replicas=1)
    settle_statefulset(kubectl, "counter", 1, "rev-2", updated=0, current="rev-1")  # a rollout that never ends
    completed_earlier(kubectl, namespace, "kept")
    proc = operators.start(namespace, KUBECONFIG=str(kubeconfig), **settings)
    apply(kubectl, resource("Restore", "waiting", checkpointId="kept-0000abcd"))
    wait_for(lambda: phase(kubectl, "restore", "waiting") == "Pending", what="the Restore to wait for the rollout")
    assert finalized(kubectl, namespace, "restore", "waiting") and finalized(kubectl, namespace, "checkpoint", "kept")
    assert operators.stop(proc) == 0  # the kubelet stops the operator's pod
    assert not finalized(kubectl, namespace, "restore", "waiting")
    assert not finalized(kubectl, namespace, "checkpoint", "kept")
    kubectl("delete", "restore/waiting", "checkpoint/kept", "--timeout=20s", timeout=30)
    account = f"system:serviceaccount:{namespace}:{RELEASE}-gym-checkpoint-operator"
    refused = [e for e in kemu.audit(user=account) if e["code"] in (401, 403)]
    assert not refused, refused
    assert "released the finalizers of checkpoints/kept, restores/waiting" in operators.log.read_text()
