"""The operator's end of life on a cluster (issue 26, item 3): `helm uninstall` followed by deleting the CRDs, and
deleting the namespace, complete within a minute; a deleted Checkpoint whose storage is gone is let go after a
bounded number of tries. The emulator holds namespaces and CRDs until the finalizers of what is inside them are
removed, as kube-apiserver and its controllers do (tests/k8s/test_deletion.py); it used to purge them, which hid
the hang.

The order they rely on (docs/operations/guide.md, "Uninstall"): the operator holds its finalizer on a Checkpoint or
Restore while it may have work at its deletion; when it stops and its release is going away - its Deployment is
gone (`helm uninstall`) or its namespace is terminating - it takes its finalizers off every resource of the release
before it exits. So the CRDs and the namespace are deleted after the operator, never waiting for it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from tests.support.ports import free_port

pytestmark = pytest.mark.k8s
CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"
GROUP = "gym-checkpoint.dev"
RELEASE = "gymtest"
FINALIZER = "gym-checkpoint.dev/operator"
DEPLOYMENT = f"{RELEASE}-gym-checkpoint-operator"


def wait_for(check: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout}s")


class Operators:
    """Operator processes (kopf), each stopped with SIGTERM as a kubelet stops a pod; killed at the end."""

    def __init__(self, kemu: Any, tmp_path: Path) -> None:
        self.kemu, self.tmp_path = kemu, tmp_path
        self.procs: list[subprocess.Popen] = []
        self.log = tmp_path / "operator.log"

    def start(self, namespace: str, **settings: str) -> subprocess.Popen:
        health = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kemu.kubeconfig),
            "GYMCKPT_CONTROL_TOKEN": "lifecycle-test-token",
            "GYMCKPT_RELEASE": RELEASE,
            "GYMCKPT_STORAGE": "s3://gone/checkpoints",
            # storage that does not answer: nothing listens on this port
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": "1",
            **settings,
        }
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kopf",
                    "run",
                    "--standalone",
                    "--namespace",
                    namespace,
                    "--liveness",
                    f"http://127.0.0.1:{health}/healthz",
                    "-m",
                    "gym_operator.handlers",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        wait_for(lambda: proc.poll() is not None or live(health), timeout=60, what="the operator to start")
        assert proc.poll() is None, self.log.read_text()[-3000:]
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen) -> int:
        """SIGTERM, as the kubelet stops a deleted pod's container; the exit code."""
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=60)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self.log.exists():
            print(self.log.read_text()[-4000:])


def live(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def operators(kemu: Any, kubectl: Any, tmp_path: Path) -> Iterator[Operators]:
    kubectl("apply", "-f", str(CRDS))
    ops = Operators(kemu, tmp_path)
    try:
        yield ops
    finally:
        ops.close()


def resource(kind: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"release": RELEASE, **spec},
    }


def completed_earlier(kubectl: Any, namespace: str, name: str, **spec: Any) -> None:
    """A Checkpoint whose transaction completed before this operator started (its status says so), with data at the
    release's storage location."""
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(resource("Checkpoint", name, **spec)))
    status = {
        "phase": "Completed",
        "reason": "Completed",
        "message": "completed earlier",
        "checkpointId": f"{name}-0000abcd",
        "location": "s3://gone/checkpoints",
    }
    kubectl(
        "patch", "checkpoint", name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def finalized(kubectl: Any, namespace: str, kind: str, name: str) -> bool:
    found = kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return found.returncode == 0 and FINALIZER in (json.loads(found.stdout)["metadata"].get("finalizers") or [])


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
    kubectl("delete", "crd", f"checkpoints.{GROUP}", f"restores.{GROUP}", "--timeout=60s", timeout=70)
    assert kubectl("get", "crd", "-o", "name").stdout.strip() == ""
    assert "Deployment gymtest-gym-checkpoint-operator is gone" in operators.log.read_text()


def watch_events(kemu: Any, path: str, since: str, until_deleted: str) -> tuple[threading.Thread, list[dict]]:
    """Collect the watch events of `path` from `since` until `until_deleted` is DELETED (bounded by 120 s)."""
    seen: list[dict] = []

    def run() -> None:
        with (
            kemu.client(timeout=httpx.Timeout(10, read=130)) as api,
            api.stream("GET", path, params={"watch": "true", "resourceVersion": since, "timeoutSeconds": "120"}) as s,
        ):
            for line in s.iter_lines():
                event = json.loads(line)
                seen.append(event)
                if event["type"] == "DELETED" and event["object"]["metadata"]["name"] == until_deleted:
                    return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, seen


def test_a_deleted_checkpoint_whose_storage_is_gone_goes_after_bounded_tries(
    operators: Operators, kemu: Any, kubectl: Any
) -> None:
    """`deletionPolicy: Delete` and storage that never answers: the operator tries GYMCKPT_DELETE_ATTEMPTS times
    (delays doubling), says so with the DataDeleted=False condition and one DeleteFailed Warning, then keeps the data,
    posts one DataKept Warning and lets the Checkpoint go. Before, it retried for ever and the Checkpoint stayed."""
    operators.start("default", GYMCKPT_DELETE_ATTEMPTS="3", GYMCKPT_DELETE_RETRY_SECONDS="1")
    completed_earlier(kubectl, "default", "unreachable", deletionPolicy="Delete")
    wait_for(lambda: finalized(kubectl, "default", "checkpoint", "unreachable"), what="the finalizer")
    since = json.loads(kubectl("get", "checkpoint", "unreachable", "-o", "json").stdout)["metadata"]["resourceVersion"]
    thread, seen = watch_events(kemu, f"/apis/{GROUP}/v1alpha1/namespaces/default/checkpoints", since, "unreachable")
    kubectl("delete", "checkpoint", "unreachable", "--timeout=60s", timeout=70)
    thread.join(timeout=60)
    conditions = [
        c
        for event in seen
        for c in (event["object"].get("status") or {}).get("conditions") or []
        if c["type"] == "DataDeleted"
    ]
    assert conditions and conditions[0]["status"] == "False" and conditions[0]["reason"] == "DeleteFailed"
    assert conditions[-1]["reason"] == "DataKept" and "unreachable-0000abcd" in conditions[-1]["message"]
    events = json.loads(kubectl("get", "events", "-o", "json").stdout)["items"]
    reasons = [e["reason"] for e in events if e["involvedObject"]["name"] == "unreachable"]
    assert reasons.count("DataKept") == 1 and reasons.count("DeleteFailed") == 1, reasons
    assert operators.log.read_text().count("attempt 3 of 3") == 0  # the third failure gives up, not retries
    assert operators.log.read_text().count("(attempt 2 of 3)") >= 1


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
    wait_for(
        lambda: "(attempt 1 of 6)" in operators.log.read_text(), timeout=60, what="the data deletion to be retried"
    )
    assert kubectl("get", "namespace", "team", "-o", "jsonpath={.status.phase}").stdout == "Terminating"
    assert operators.stop(proc) == 0
    kubectl("wait", "--for=delete", "namespace/team", "--timeout=60s", timeout=70)
    assert "namespace team is being deleted" in operators.log.read_text()
