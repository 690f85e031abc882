"""What the operator's tests on the emulator share: the stack's server processes and their Pods, the operator as a
process, resource documents, and the probes the tests read (a pause monitor, a proxy that withholds a call).

The fixtures that use these are in ``conftest.py``. Each test keeps to its own namespace (the ``namespace``
fixture; ``kubectl`` defaults to it), so the tests of one file can share one emulator: pods, Checkpoints,
Restores, Events and the operator's Kubernetes Lease of one test are never seen by another.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import yaml
from tests.support.ports import free_port

from gym_services.stack.config import ServerSpec, StackConfig
from gym_services.stack.launcher import stack_secrets, start_stack, stop_stack

CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"
GROUP = "gym-checkpoint.dev"
RELEASE = "gymtest"
FINALIZER = f"gym-checkpoint.dev/operator-{RELEASE}"


def finalizer_of(release: str = RELEASE) -> str:
    """The finalizer the operator of ``release`` puts on its resources that need it at their deletion."""
    return f"gym-checkpoint.dev/operator-{release}"


#: leader election in these tests: a dead leader's Kubernetes Lease is taken after 8 s; a leader gives up after 6 s
#: unrenewed
LEADER_TIMINGS = {
    "GYMCKPT_LEADER_LEASE_SECONDS": "8",
    "GYMCKPT_LEADER_RENEW_DEADLINE_SECONDS": "6",
    "GYMCKPT_LEADER_RETRY_SECONDS": "0.5",
}
#: for a test whose API server is away longer than the renew deadline above
LONG_LEADER_TIMINGS = {
    "GYMCKPT_LEADER_LEASE_SECONDS": "60",
    "GYMCKPT_LEADER_RENEW_DEADLINE_SECONDS": "40",
    "GYMCKPT_LEADER_RETRY_SECONDS": "0.5",
}

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout}s")


#: the emulators (by kubeconfig) that have the CRDs already
_with_crds: set[Path] = set()


def install_crds(kemu: Any, kubectl: Kubectl) -> None:
    """The chart's CRDs, once per emulator."""
    if kemu.kubeconfig not in _with_crds:
        kubectl("apply", "-f", str(CRDS))
        _with_crds.add(kemu.kubeconfig)


# --- the stack: real servers as processes, their Pods in the emulator ---------------------------------------------


class Stack:
    """Real counter servers as processes, and their Pod objects in the emulator (in ``kubectl``'s namespace)."""

    started: ClassVar[list[Stack]] = []

    def __init__(
        self,
        tmp: Path,
        kubectl: Kubectl,
        modes: dict[str, str],
        release: str = RELEASE,
        config: dict[str, Any] | None = None,
    ) -> None:
        """``config``: more of every server's config (e.g. its ``storage``)."""
        self.tmp, self.kubectl, self.modes, self.release = tmp, kubectl, modes, release
        self.ports: dict[str, int] = {}  # known once started: the launcher binds port 0 and keeps the socket
        self.config = StackConfig(
            name="k8s",
            state_dir=str(tmp / "stack"),
            servers={
                name: ServerSpec(server="counter", config={"checkpoint_mode": mode, **(config or {})})
                for name, mode in modes.items()
            },
        )
        self.token = stack_secrets(tmp / "stack")["control_token"]

    def start(self) -> None:
        """Starts the servers; the first start takes any free ports (bound, never probed and released, so no
        other process can take one in between) and a restart reuses them, as a restarted pod keeps its address."""
        self.state = start_stack(self.config, self.tmp)  # (a stack that fails to start stops what it started)
        if not self.ports:
            self.ports = {server.name: server.port for server in self.state.servers}
            self.config = self.config.model_copy(
                update={
                    "servers": {
                        name: spec.model_copy(update={"port": self.ports[name]})
                        for name, spec in self.config.servers.items()
                    }
                }
            )
        if self not in Stack.started:
            Stack.started.append(self)

    def kill(self) -> None:
        stop_stack(self.tmp / "stack", kill=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def create_pods(
        self, control_ports: dict[str, int] | None = None, labels: dict[str, dict[str, str]] | None = None
    ) -> None:
        """One Pod per server; ``control_ports`` points a pod's control-port annotation elsewhere (a proxy),
        ``labels`` adds labels to some pods."""
        for name in self.modes:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": {
                        "app.kubernetes.io/instance": self.release,
                        "gym-checkpoint.dev/role": "resources",
                        "gym-checkpoint.dev/participant": "counter",
                        **(labels or {}).get(name, {}),
                    },
                    "annotations": {
                        "gym-checkpoint.dev/control-port": str((control_ports or {}).get(name, self.ports[name]))
                    },
                },
                "spec": {"containers": [{"name": "server", "image": "gym-checkpoint:test"}]},
            }
            self.kubectl("apply", "-f", "-", input=json.dumps(pod))
            running(self.kubectl, name)


def running(kubectl: Kubectl, pod: str) -> None:
    """A pod's status as its kubelet would write it once its container runs (the emulator runs none)."""
    status = {"status": {"podIP": "127.0.0.1", "phase": "Running"}}
    kubectl("patch", "pod", pod, "--subresource=status", "--type=merge", "-p", json.dumps(status))


def participant_pods(kubectl: Kubectl, state: Any, token: str) -> None:
    """(Re)create one Pod per participant process, as a rescheduled StatefulSet would: same name, new address."""
    for server in state.participants():
        status = httpx.get(
            f"{server.url}/ng-control/v1/checkpoint/status", headers={"authorization": f"Bearer {token}"}
        ).json()
        kubectl("delete", "pod", server.name, "--ignore-not-found=true")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": server.name,
                "labels": {
                    "app.kubernetes.io/instance": RELEASE,
                    "gym-checkpoint.dev/role": status["role"],
                    "gym-checkpoint.dev/participant": server.server,
                },
                "annotations": {"gym-checkpoint.dev/control-port": str(server.port)},
            },
            "spec": {"containers": [{"name": "server", "image": "gym-checkpoint:test"}]},
        }
        kubectl("apply", "-f", "-", input=json.dumps(pod))
        running(kubectl, server.name)


def own_by_statefulset(kubectl: Kubectl, pod: str, name: str, replicas: int) -> None:
    """A StatefulSet ``name`` with ``replicas`` owns ``pod``, annotated as the chart annotates a replicated server's
    pods (the emulator runs no controller: the pod stays the one the test made)."""
    labels = {"app.kubernetes.io/instance": RELEASE, "gym-checkpoint.dev/participant": "counter"}
    apply(
        kubectl,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "serviceName": name,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "server", "image": "gym-checkpoint:test"}]},
                },
            },
        },
    )
    settle_statefulset(kubectl, name, replicas, "rev-1")
    uid = get(kubectl, "statefulset", name)["metadata"]["uid"]
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "uid": uid, "controller": True}
    patch = {"metadata": {"annotations": {"gym-checkpoint.dev/replicas": str(replicas)}, "ownerReferences": [owner]}}
    kubectl("patch", "pod", pod, "--type=merge", "-p", json.dumps(patch))


def settle_statefulset(
    kubectl: Kubectl, name: str, replicas: int, revision: str, updated: int | None = None, current: str | None = None
) -> None:
    """Write a StatefulSet's status as its controller would (the emulator runs none): settled at ``revision``, or
    mid-rollout with ``updated`` pods at ``revision`` and the rest at ``current``."""
    sts = get(kubectl, "statefulset", name)
    updated = replicas if updated is None else updated
    status = {
        "observedGeneration": sts["metadata"]["generation"],
        "replicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
        "currentReplicas": replicas - updated if current else replicas,
        "updatedReplicas": updated,
        "currentRevision": current or revision,
        "updateRevision": revision,
    }
    kubectl("patch", "statefulset", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))


# --- the operator as a process -----------------------------------------------------------------------------------


def operator_live(port: int) -> bool:
    """gym-operator answers its liveness probe from its start, leading or standing by."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def leads(port: int) -> bool:
    """Whether the operator answering on ``port`` holds its leadership and its kopf has started (watches opening)."""
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
    except httpx.HTTPError:
        return False
    return bool(health["leader"] and health["operating"])


def stop_processes(procs: list[subprocess.Popen[bytes]], signal_first: int = signal.SIGTERM) -> None:
    """Every process still running: ``signal_first`` to its group, then SIGKILL after 10 s."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal_first)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


class Operators:
    """Operator processes run by ``kopf run`` with the handlers alone (no leader election), each stopped with
    SIGTERM as a kubelet stops a pod; killed at the end. Their storage does not answer (nothing listens on its
    port): what they do with stored data can only fail."""

    def __init__(self, kemu: Any, tmp_path: Path) -> None:
        self.kemu, self.tmp_path = kemu, tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log = tmp_path / "operator.log"

    def start(self, namespace: str, **settings: str) -> subprocess.Popen[bytes]:
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
        command = [sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", namespace]
        command += ["--liveness", f"http://127.0.0.1:{health}/healthz", "-m", "gym_operator.handlers"]
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        wait_for(lambda: proc.poll() is not None or operator_live(health), timeout=60, what="the operator to start")
        assert proc.poll() is None, self.log.read_text()[-3000:]
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen[bytes]) -> int:
        """SIGTERM, as the kubelet stops a deleted pod's container; the exit code."""
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=60)

    def close(self) -> None:
        stop_processes(self.procs, signal.SIGKILL)
        if self.log.exists():
            print(self.log.read_text()[-4000:])


def leadership_of(kubectl: Kubectl, name: str = f"{RELEASE}-gym-checkpoint-operator") -> dict[str, Any]:
    """The release's Kubernetes Lease (its operators' leadership)."""
    return get(kubectl, "lease", name)


# --- resources and what the API says about them --------------------------------------------------------------------


def get(kubectl: Kubectl, kind: str, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("get", kind, name, "-o", "json").stdout))


def apply(kubectl: Kubectl, doc: dict[str, Any]) -> None:
    """Apply a resource; a Checkpoint or Restore is for the test's release unless its spec names one."""
    if doc.get("kind") in ("Checkpoint", "Restore"):
        doc = {**doc, "spec": {"release": RELEASE, **doc.get("spec", {})}}
    kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))


def checkpoint_doc(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gym-checkpoint.dev/v1alpha1",
        "kind": "Checkpoint",
        "metadata": {"name": name},
        "spec": {"release": RELEASE, **spec},
    }


def restore_of(name: str, checkpoint: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gym-checkpoint.dev/v1alpha1",
        "kind": "Restore",
        "metadata": {"name": name},
        "spec": {"release": RELEASE, "checkpointRef": {"name": checkpoint}, **spec},
    }


def resource(kind: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"release": RELEASE, **spec},
    }


def completed_earlier(
    kubectl: Kubectl, namespace: str, name: str, location: str = "s3://gone/checkpoints", **spec: Any
) -> None:
    """A Checkpoint whose transaction completed before this operator started (its status says so), with data at the
    release's storage location (``location``: the Operators fixture's, whose storage never answers)."""
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(resource("Checkpoint", name, **spec)))
    status = {
        "phase": "Completed",
        "reason": "Completed",
        "message": "completed earlier",
        "checkpointId": f"{name}-0000abcd",
        "location": location,
    }
    kubectl(
        "patch", "checkpoint", name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def finalized(kubectl: Kubectl, namespace: str, kind: str, name: str) -> bool:
    found = kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return found.returncode == 0 and FINALIZER in (json.loads(found.stdout)["metadata"].get("finalizers") or [])


def phase(kubectl: Kubectl, kind: str, name: str) -> str | None:
    return (get(kubectl, kind, name).get("status") or {}).get("phase")


def checkpoints(kubectl: Kubectl, selector: str) -> dict[str, dict[str, Any]]:
    """The Checkpoints ``selector`` (a label selector) picks, by name."""
    found = json.loads(kubectl("get", "checkpoints", "-l", selector, "-o", "json").stdout)["items"]
    return {c["metadata"]["name"]: c for c in found}


def gone(kubectl: Kubectl, kind: str, name: str) -> bool:
    return kubectl("get", kind, name, check=False).returncode != 0


def reasons_of(kubectl: Kubectl, name: str) -> list[str]:
    """The reasons of the Events on ``name`` (in the test's namespace), oldest first."""
    events = json.loads(kubectl("get", "events", "-o", "json").stdout)["items"]
    return [e["reason"] for e in events if e["involvedObject"]["name"] == name]


def wait_phase(kubectl: Kubectl, kind: str, name: str, phase: str, timeout_s: int = 60) -> None:
    """``kubectl wait`` until the resource's ``status.phase`` is ``phase``."""
    kubectl(
        "wait", f"--for=jsonpath={{.status.phase}}={phase}", f"{kind}/{name}", f"--timeout={timeout_s}s",
        timeout=timeout_s + 10,
    )  # fmt: skip


def completed_checkpoint(kubectl: Kubectl, stack: Stack, name: str) -> dict[str, Any]:
    """Take a checkpoint of a stack with one live session; its status once Completed."""
    with httpx.Client(base_url=stack.url("counter-0")) as http:
        http.post("/seed_session", json={"start": 5}, headers={"x-ng-rollout-id": "r0"})
    apply(kubectl, checkpoint_doc(name, prepareTimeoutSeconds=10))
    wait_phase(kubectl, "checkpoint", name, "Completed")
    return dict(get(kubectl, "checkpoint", name)["status"])


def checkpoint_without_the_operator(stack: Stack, location: str, checkpoint_id: str) -> None:
    """A checkpoint of the stack written to ``location`` by a coordinator of the test's own (as ``gymckpt`` would,
    or an operator on a cluster that is gone), with the keys in the environment."""
    from gym_services.coordination.client import ControlClient, ParticipantRef
    from gym_services.coordination.coordinator import Coordinator

    async def run() -> None:
        refs = [ParticipantRef(participant_id=n, role="resources", url=stack.url(n)) for n in stack.modes]
        async with ControlClient(stack.token, timeout_s=30) as client:
            done = await Coordinator(refs, client).checkpoint(checkpoint_id, location, prepare_timeout_s=10)
        assert done.completed, done.error

    asyncio.run(run())


def stored_objects(seaweed: Any, location: str, checkpoint_id: str) -> list[str]:
    bucket, prefix = location[len("s3://") :].split("/", 1)
    found = seaweed.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/checkpoints/{checkpoint_id}/")
    return [o["Key"] for o in found.get("Contents", [])]


# --- the servers, as the rollouts see them ---------------------------------------------------------------------------


def status_of(stack: Stack, name: str) -> dict[str, Any]:
    return dict(
        httpx.get(
            f"{stack.url(name)}/ng-control/v1/checkpoint/status",
            headers={"authorization": f"Bearer {stack.token}"},
            timeout=5,
        ).json()
    )


def admission_is_open(stack: Stack) -> bool:
    return all(status_of(stack, name)["admission_open"] for name in stack.modes)


class PauseMonitor:
    """Polls every server's admission every 20 ms from a thread: how long the stack stayed paused (any server
    closed), as the rollouts see it."""

    def __init__(self, stack: Stack, interval_s: float = 0.02) -> None:
        self.stack, self.interval_s = stack, interval_s
        self.spans: list[tuple[float, float]] = []
        self._since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _closed(self) -> bool:
        try:
            return not admission_is_open(self.stack)
        except (httpx.TransportError, ValueError, KeyError):
            return False  # a server that does not answer is not paused (it is dead, or restarting)

    def _run(self) -> None:
        while not self._stop.is_set():
            now, closed = time.monotonic(), self._closed()
            if closed and self._since is None:
                self._since = now
            elif not closed and self._since is not None:
                self.spans.append((self._since, now))
                self._since = None
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PauseMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._since is not None:
            self.spans.append((self._since, time.monotonic()))

    def longest(self) -> float:
        return max((end - start for start, end in self.spans), default=0.0)

    def total(self) -> float:
        return sum(end - start for start, end in self.spans)


def report_pause(scenario: str, pause: PauseMonitor, **extra: object) -> None:
    """One line per fault test with the pause the rollouts saw (`pytest -s` shows them)."""
    fields = " ".join(f"{k}={v}" for k, v in extra.items())
    print(
        f"\nPAUSE {scenario}: longest {pause.longest():.3f}s, total {pause.total():.3f}s in {len(pause.spans)} "
        f"span(s) {fields}".rstrip(),
        flush=True,
    )


class WithholdingProxy:
    """A real HTTP server on 127.0.0.1 in front of one server's control port: it forwards (and records, in
    ``calls``) every call but withholds ``verb`` (resume, persist, ...) while ``hold`` is set, so the operator can be
    killed with that call in flight. A withheld call is then answered 503, or forwarded late with
    ``forward_withheld`` (as a call the server received before its caller died)."""

    def __init__(self, upstream: str, verb: str = "resume", forward_withheld: bool = False) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        self.hold = threading.Event()
        self.withheld = threading.Event()
        self.port = free_port()
        #: every call it received: (time.monotonic(), path, the leader term it named or None)
        self.calls: list[tuple[float, str, str | None]] = []

        async def forward(request: Request) -> Response:
            self.calls.append((time.monotonic(), request.url.path, request.headers.get("x-gym-leader-term")))
            body = await request.body()
            if self.hold.is_set() and request.url.path.endswith(f"/{verb}"):
                self.withheld.set()
                while self.hold.is_set():
                    await asyncio.sleep(0.05)
                if not forward_withheld:
                    return Response(status_code=503)
            async with httpx.AsyncClient() as client:
                answer = await client.request(
                    request.method,
                    f"{upstream}{request.url.path}",
                    content=body,
                    headers=dict(request.headers),
                    timeout=60,
                )
            return Response(answer.content, status_code=answer.status_code, media_type="application/json")

        app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, what="the proxy to start")

    def stop(self) -> None:
        self.hold.clear()
        self.server.should_exit = True
        self.thread.join(timeout=10)


# --- the chart's identity ------------------------------------------------------------------------------------------


def chart_operator_identity(
    kemu: Any, kubectl: Kubectl, namespace: str, tmp_path: Path, values: dict[str, Any] | None = None
) -> tuple[Path, dict[str, str], dict[str, Any]]:
    """The chart's operator ServiceAccount, Role and RoleBinding (rendered by Helm for release RELEASE in
    ``namespace`` with ``values``) installed into the emulator, with the storage locations it renders from
    ``storage.locations`` (not the release's ``default``: the test's operator keeps its own); a kubeconfig with that
    ServiceAccount's token, the operator settings the chart's Deployment sets, and the Role."""
    helm = pytest.importorskip("helm_python")
    with helm.Chart.load(str(CRDS.parent)) as chart:
        files = chart.render(values or {}, name=RELEASE, namespace=namespace)
    locations = [
        doc
        for doc in yaml.safe_load_all(files["gym-checkpoint/templates/storagelocations.yaml"])
        if doc and doc["metadata"]["labels"]["gym-checkpoint.dev/location"] != "default"
    ]
    if locations:
        kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(locations))
    docs = [doc for doc in yaml.safe_load_all(files["gym-checkpoint/templates/operator.yaml"]) if doc]
    kinds = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    rbac = [doc for doc in docs if doc["kind"] in kinds]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(rbac))
    deployment = next(doc for doc in docs if doc["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    names = (
        "GYMCKPT_PARTICIPANT_SELECTOR",
        "GYMCKPT_KOPF_SCANNING",
        "GYMCKPT_OPERATOR_DEPLOYMENT",
        "GYMCKPT_LEADER_LEASE",
        "GYMCKPT_AUTO_RESTORE",
        "GYMCKPT_TERMINATION_CHECKPOINT",
        "GYMCKPT_TERMINATION_MARGIN_SECONDS",
        "GYMCKPT_TERMINATION_LEASE_SECONDS",
    )
    settings = {item["name"]: item["value"] for item in container["env"] if "value" in item and item["name"] in names}
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    token = kubectl("-n", namespace, "create", "token", account).stdout.strip()
    role = next(doc for doc in rbac if doc["kind"] == "Role")
    return kemu.kubeconfig_for(token, tmp_path / "operator-kubeconfig.yaml", namespace), settings, role
