"""Deletion as kube-apiserver and its controllers do it: namespaces and CRDs wait for the
finalizers of what is inside them, deletion bumps `generation`, and scheduled pods stay `Terminating` for their
grace period. The operator's uninstall and namespace-deletion tests (tests/operator/test_release_cleanup_k8s.py)
stand on these: an emulator that purged finalized objects once hid their hang at uninstall."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.k8s

CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"
GROUP = "gym-checkpoint.dev"
FINALIZER = "gym-checkpoint.dev/test"


def wait_for(check: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout}s")


def checkpoint(name: str, finalizers: list[str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "Checkpoint",
        "metadata": {"name": name, **({"finalizers": finalizers} if finalizers else {})},
        "spec": {"release": "gym"},
    }


def unfinalize(api: httpx.Client, url: str) -> None:
    answer = api.patch(
        url,
        headers={"Content-Type": "application/merge-patch+json"},
        content=json.dumps({"metadata": {"finalizers": None}}),
    )
    assert answer.status_code in (200, 404), answer.text


def test_namespace_deletion_waits_for_the_finalizers_of_its_objects(kemu: Any, kubectl: Any) -> None:
    """The namespace registry marks it Terminating; the namespace controller deletes what is inside (objects with
    finalizers get a deletionTimestamp and stay) and removes the namespace once it is empty. Nothing new may be
    created meanwhile (NamespaceLifecycle admission), and `default` may not be deleted at all."""
    kubectl("apply", "-f", str(CRDS / "checkpoints.yaml"))
    kubectl("create", "namespace", "doomed")
    kubectl("create", "configmap", "plain", "-n", "doomed", "--from-literal=a=b")
    ckpts = f"/apis/{GROUP}/v1alpha1/namespaces/doomed/checkpoints"
    with kemu.client() as api:
        assert api.post(ckpts, json=checkpoint("held", [FINALIZER])).status_code == 201
        assert api.post(ckpts, json=checkpoint("free")).status_code == 201
        kubectl("delete", "namespace", "doomed", "--wait=false")

        namespace = api.get("/api/v1/namespaces/doomed").json()
        assert namespace["status"]["phase"] == "Terminating" and namespace["metadata"]["deletionTimestamp"]
        assert api.get("/api/v1/namespaces/doomed/configmaps/plain").status_code == 404
        assert api.get(f"{ckpts}/free").status_code == 404
        held = api.get(f"{ckpts}/held").json()
        assert held["metadata"]["deletionTimestamp"] and held["metadata"]["generation"] == 2

        refused = api.post("/api/v1/namespaces/doomed/configmaps", json={"metadata": {"name": "late"}})
        assert refused.status_code == 403
        assert "because it is being terminated" in refused.json()["message"]
        assert refused.json()["details"]["causes"][0]["reason"] == "NamespaceTerminating"

        unfinalize(api, f"{ckpts}/held")
        assert api.get(f"{ckpts}/held").status_code == 404
        assert api.get("/api/v1/namespaces/doomed").status_code == 404
    assert "doomed" not in kubectl("get", "namespaces", "-o", "name").stdout
    default = kubectl("delete", "namespace", "default", check=False)
    assert default.returncode != 0 and "this namespace may not be deleted" in default.stderr


def test_crd_deletion_waits_for_the_finalizers_of_its_custom_resources(kemu: Any, kubectl: Any) -> None:
    """apiextensions' CRD registry adds the cleanup finalizer and a Terminating condition; its finalizer controller
    deletes every custom resource and releases the CRD once none is left. Creating one meanwhile is refused (405);
    the resource is served until the CRD goes."""
    kubectl("apply", "-f", str(CRDS / "checkpoints.yaml"))
    kubectl("create", "namespace", "other")
    with kemu.client() as api:
        held_url = f"/apis/{GROUP}/v1alpha1/namespaces/default/checkpoints/held"
        for namespace, body in (("default", checkpoint("held", [FINALIZER])), ("other", checkpoint("free"))):
            api.post(f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/checkpoints", json=body).raise_for_status()
        kubectl("delete", "crd", f"checkpoints.{GROUP}", "--wait=false")

        crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/checkpoints.{GROUP}").json()
        assert crd["metadata"]["deletionTimestamp"]
        assert "customresourcecleanup.apiextensions.k8s.io" in crd["metadata"]["finalizers"]
        terminating = [c for c in crd["status"]["conditions"] if c["type"] == "Terminating"]
        assert terminating and terminating[0]["status"] == "True"
        assert api.get(f"/apis/{GROUP}/v1alpha1/namespaces/other/checkpoints/free").status_code == 404
        held = api.get(held_url).json()
        assert held["metadata"]["deletionTimestamp"] and held["metadata"]["generation"] == 2
        refused = api.post(f"/apis/{GROUP}/v1alpha1/namespaces/default/checkpoints", json=checkpoint("late"))
        assert refused.status_code == 405
        assert refused.json()["message"] == "create not allowed while custom resource definition is terminating"

        unfinalize(api, held_url)
        assert (
            api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/checkpoints.{GROUP}").status_code == 404
        )
        assert api.get(f"/apis/{GROUP}").status_code == 404
    # `kubectl delete crd` waits for it: with nothing finalized it returns once the CRD is gone
    kubectl("apply", "-f", str(CRDS / "restores.yaml"))
    kubectl("delete", "crd", f"restores.{GROUP}", timeout=30)


def test_deletion_bumps_the_generation_once(kemu: Any) -> None:
    """registry.markAsDeleting: the first deletion of an object that has finalizers bumps metadata.generation (its
    controllers see a new generation to act on); a second DELETE changes nothing."""
    with kemu.client() as api:
        api.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "c", "finalizers": [FINALIZER]}})
        url = "/api/v1/namespaces/default/configmaps/c"
        first = api.delete(url).json()
        assert first["metadata"]["generation"] == 2 and first["metadata"]["deletionGracePeriodSeconds"] == 0
        again = api.delete(url).json()
        assert again["metadata"]["generation"] == 2
        assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        unfinalize(api, url)
        assert api.get(url).status_code == 404


def pod(name: str, node: str | None = "node-1", grace: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_a_scheduled_pod_stays_terminating_for_its_grace_period(kemu: Any, kubectl: Any) -> None:
    """The pod strategy's graceful deletion: a scheduled pod gets deletionTimestamp = now + its grace period and
    stays (its kubelet stops the containers) until that runs out; a shorter grace period on a second DELETE ends
    it sooner, 0 at once. An unscheduled pod goes at once, as in kube-apiserver."""
    pods = "/api/v1/namespaces/default/pods"
    with kemu.client() as api:
        for body in (pod("slow", grace=300), pod("short", grace=300), pod("forced"), pod("unscheduled", node=None)):
            api.post(pods, json=body).raise_for_status()

        slow = api.delete(f"{pods}/slow").json()
        assert slow["metadata"]["deletionGracePeriodSeconds"] == 300 and slow["metadata"]["deletionTimestamp"]
        assert api.get(f"{pods}/slow").json()["metadata"]["deletionTimestamp"] == slow["metadata"]["deletionTimestamp"]

        api.delete(f"{pods}/short")
        shortened = api.request("DELETE", f"{pods}/short", json={"gracePeriodSeconds": 1}).json()
        assert shortened["metadata"]["deletionGracePeriodSeconds"] == 1
        wait_for(lambda: api.get(f"{pods}/short").status_code == 404, what="the shortened grace period to end")

        api.delete(f"{pods}/forced")
        assert api.request("DELETE", f"{pods}/forced", json={"gracePeriodSeconds": 0}).status_code == 200
        assert api.get(f"{pods}/forced").status_code == 404
        assert api.delete(f"{pods}/unscheduled").status_code == 200
        assert api.get(f"{pods}/unscheduled").status_code == 404
        assert api.get(f"{pods}/slow").status_code == 200  # still Terminating
    kubectl("delete", "pod", "slow", "--grace-period=0", "--force")
    assert kubectl("get", "pod", "slow", check=False).returncode != 0


def test_a_watch_sees_a_terminating_pod_then_its_deletion(kemu: Any) -> None:
    """kopf and `kubectl wait --for=delete` see MODIFIED (deletionTimestamp) and, after the grace period, DELETED."""
    pods = "/api/v1/namespaces/default/pods"
    with kemu.client() as api:
        created = api.post(pods, json=pod("watched", grace=1)).json()
        api.delete(f"{pods}/watched")
        seen = []
        with api.stream(
            "GET",
            pods,
            params={"watch": "true", "resourceVersion": created["metadata"]["resourceVersion"], "timeoutSeconds": "20"},
        ) as stream:
            for line in stream.iter_lines():
                event = json.loads(line)
                seen.append((event["type"], bool(event["object"]["metadata"].get("deletionTimestamp"))))
                if event["type"] == "DELETED":
                    break
    assert seen == [("MODIFIED", True), ("DELETED", True)]


def test_namespace_deletion_waits_for_terminating_pods(kemu: Any, kubectl: Any) -> None:
    kubectl("create", "namespace", "pods-ns")
    with kemu.client() as api:
        api.post("/api/v1/namespaces/pods-ns/pods", json=pod("p", grace=300)).raise_for_status()
        kubectl("delete", "namespace", "pods-ns", "--wait=false")
        assert api.get("/api/v1/namespaces/pods-ns/pods/p").json()["metadata"]["deletionGracePeriodSeconds"] == 300
        assert api.get("/api/v1/namespaces/pods-ns").json()["status"]["phase"] == "Terminating"
        api.request("DELETE", "/api/v1/namespaces/pods-ns/pods/p", json={"gracePeriodSeconds": 0})
        assert api.get("/api/v1/namespaces/pods-ns").status_code == 404
