"""An emulated cluster for the chart: the API emulator (kemu) plus the controllers and kubelet it lacks.

`helm install` puts the chart's objects into kemu, exactly as rendered. This module then does what a real
cluster's controllers and kubelets would: for every StatefulSet it creates its pods ``<name>-0`` ...
``<name>-<replicas-1>`` (for a Deployment, ``<name>-<template hash>-<i>``) from the template and runs each
container's command as a local process; for every Job (the hooks) it runs the init containers' commands one after
the other, then the container's, and writes the Job's status, which Helm waits for. Pods get podIP 127.0.0.1 and
Ready once their
readiness probe answers.

StatefulSets are rolled as kube-controller-manager's StatefulSet controller does: each pod is labelled
``controller-revision-hash`` with the revision it was made from (``<name>-<hash of the pod template>``); when the
template changes under ``RollingUpdate``, one pod at a time, highest ordinal first (at or above the partition), is
deleted once every pod exists and is ready, and made again from the new revision; ``OnDelete`` leaves pods alone.
The StatefulSet's status (observedGeneration, currentRevision, updateRevision, replicas, readyReplicas,
updatedReplicas, currentReplicas) is written through the status subresource. Where it simplifies: pods are
created all at once (the chart's ``podManagementPolicy: Parallel``), a deleted pod below the partition comes back at
the update revision (the real one restores the current revision's template), no ControllerRevision objects,
``minReadySeconds`` and ``maxUnavailable`` are ignored. ``roll_budget`` lets a test hold a rollout midway.

The kubelet's part, as a node's kubelet does it: every pod is scheduled (``spec.nodeName``), so a deleted pod stays
``Terminating`` until its ``deletionTimestamp`` (the API server's graceful deletion); the kubelet sends its containers
SIGTERM at once, SIGKILL when the grace period ends, and deletes the pod for good (grace 0) as soon as they have
exited; the StatefulSet controller then makes the pod again. A container that exits while its pod is not being deleted
is restarted in place (``restartPolicy: Always``; the pod is not Ready until its readiness probe answers again), as
after a crash or an OOM kill. ``replace_pods`` is a node failure: SIGKILL and a deletion without grace.

What it must translate, because every pod shares this machine's network and file system:
- ports: each pod's ports (declared container ports, and the pod-local ones its command names, such as
  SeaweedFS's) map to free ports on 127.0.0.1; a pod's ``gym-checkpoint.dev/control-port`` annotation names
  the mapped control port (the only field of a pod object that differs from its template);
- cluster DNS: ``http://<service>.<namespace>.svc:<port>`` in ConfigMaps and env becomes the mapped port of the pod
  behind that Service (its first pod), ``http://<pod>.<headless service>.<namespace>.svc:<port>`` the mapped
  port of that pod, and a range of pods (``<sts>-{0..N-1}.<headless>...``, the chart's URL of a replicated
  server) the list of their mapped URLs. What a pod reads from the API at run time (a CheckpointStorageLocation's
  ``spec.endpoint``, which the operator reads) keeps its ``.svc`` address, as in a real cluster: every pod's Python
  resolves ``.svc`` names through the table the cluster keeps (``tests/chart/dns/sitecustomize.py``);
- volumes: a ConfigMap volume is written to a folder, an emptyDir is a folder, a volumeClaimTemplate is a folder
  that outlives the pod (a PersistentVolume); mount paths in commands and server configs point there;
- credentials: a pod that mounts its ServiceAccount's token (``automountServiceAccountToken``, true unless the pod
  or the account says false) gets a kubeconfig with a token of that ServiceAccount (TokenRequest API), so the operator
  and the hook Jobs act under the chart's own RBAC; the others get none.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gym_services.stack.objectstore import port_free, weed_binary

BIN = Path(sys.executable).parent
DNS_RESOLVER = Path(__file__).resolve().parent / "dns"
SVC_URL = re.compile(r"http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc:(\d+)")
POD_URL = re.compile(r"http://([a-z0-9-]+)\.([a-z0-9-]+)\.([a-z0-9-]+)\.svc:(\d+)")  # <pod>.<headless service>.<ns>
ORDINALS = re.compile(r"\{(\d+)\.\.(\d+)\}")  # a replicated server's pods in one URL (the chart's serverUrl)
PORT_FLAGS = ("--port", "--control-port")
NODE = "kemu-node"  # the node every pod is scheduled on
REVISION_LABEL = "controller-revision-hash"


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def revision_of(sts: dict[str, Any]) -> str:
    """A StatefulSet's update revision, named as its controller names ControllerRevisions: ``<name>-<hash of the
    pod template>`` (the real hash covers the template as stored in the revision; any stable hash serves)."""
    return f"{sts['metadata']['name']}-{_hash(sts['spec']['template'])[:10]}"


@dataclass
class PodRun:
    name: str
    owner: str  # StatefulSet/Deployment/Job name
    kind: str
    template: dict[str, Any]
    revision: str = ""  # a StatefulSet's pod: the controller-revision-hash it was made from
    procs: list[subprocess.Popen] = field(default_factory=list)
    ready: bool = False
    started: float = 0.0
    #: each container's command line and environment (to restart it in place)
    commands: list[tuple[list[str], dict[str, str], Path]] = field(default_factory=list)
    restarts: int = 0
    #: when the grace period of its deletion ends (monotonic), once the kubelet sent SIGTERM
    kill_at: float | None = None


class Cluster:
    """Controllers and kubelet for one namespace of a kemu emulator. Use as a context manager."""

    def __init__(self, kemu: Any, workdir: Path, namespace: str = "default", workloads: bool = True) -> None:
        """``workloads=False``: run the Jobs only (the chart's hooks), no StatefulSet or Deployment pod."""
        self.workloads = workloads
        self.kemu = kemu
        self.url, self.kubeconfig = kemu.url, kemu.kubeconfig
        self.workdir = workdir
        self.ns = namespace
        self.api = kemu.client(timeout=30)
        self.pods: dict[str, PodRun] = {}
        self.ports: dict[tuple[str, int], int] = {}
        self.jobs: dict[str, str] = {}  # job uid -> 'running' | 'done'
        self._job_threads: list[threading.Thread] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        #: the cluster DNS table the pods read (see _write_dns)
        self.dns_table = workdir / "cluster-dns.json"
        self._dns_text = ""
        self._dns_versions: list[Any] = []
        #: how many more pods the StatefulSet rollouts may replace (None: no limit): a test holds a rollout midway
        self.roll_budget: int | None = None

    # --- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        self._thread = threading.Thread(target=self._loop, name="kemu-cluster", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            for run in list(self.pods.values()):
                self._kill(run, signal.SIGKILL)
        for thread in self._job_threads:
            thread.join(timeout=30)
        self.api.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(0.3)

    # --- API helpers -------------------------------------------------------------------------------------

    def items(self, path: str) -> list[dict[str, Any]]:
        resp = self.api.get(path)
        resp.raise_for_status()
        return resp.json()["items"]

    def get(self, path: str) -> dict[str, Any] | None:
        resp = self.api.get(path)
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        return resp.json()

    def _core(self, plural: str, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.ns}/{plural}" + (f"/{name}" if name else "")

    def _apps(self, plural: str, name: str = "") -> str:
        return f"/apis/apps/v1/namespaces/{self.ns}/{plural}" + (f"/{name}" if name else "")

    def secret_value(self, name: str, key: str) -> str:
        secret = self.get(self._core("secrets", name))
        if secret is None or key not in (secret.get("data") or {}):
            raise KeyError(f"secret {name} has no key {key}")
        return base64.b64decode(secret["data"][key]).decode()

    # --- the controllers ------------------------------------------------------------------------------------

    def reconcile(self) -> None:
        with self._lock:
            wanted: dict[str, tuple[str, str, dict[str, Any], str]] = {}  # pod -> kind, owner, object, revision
            statefulsets = self.items(self._apps("statefulsets")) if self.workloads else []
            for sts in statefulsets:
                name, revision = sts["metadata"]["name"], revision_of(sts)
                for ordinal in range(sts["spec"].get("replicas", 1)):  # pods <name>-0 ... <name>-<replicas-1>
                    wanted[f"{name}-{ordinal}"] = ("StatefulSet", name, sts, revision)
            if self.workloads:
                for dep in self.items(self._apps("deployments")):
                    prefix = f"{dep['metadata']['name']}-{_hash(dep['spec']['template'])[:5]}"
                    for index in range(dep["spec"].get("replicas", 1)):  # (a ReplicaSet names them at random)
                        wanted[f"{prefix}-{index}"] = ("Deployment", dep["metadata"]["name"], dep, "")
            for name, run in list(self.pods.items()):
                if run.kind == "Job":
                    continue
                existing = self.get(self._core("pods", name))
                if existing is None:  # deleted without grace, or its grace period ran out in the API
                    self._kill(run, signal.SIGKILL)
                    del self.pods[name]
                elif existing["metadata"].get("deletionTimestamp"):  # deleted: a drain, an eviction, a test
                    self._terminate(run, existing)
                elif name not in wanted:  # scaled down: its controller deletes it (the kubelet then stops it)
                    self.api.delete(self._core("pods", name))
                else:
                    self._restart_exited(run)
            for sts in statefulsets:
                self._roll(sts)
            for name, (kind, owner, obj, revision) in wanted.items():
                if name not in self.pods:
                    self._start_pod(name, kind, owner, obj, revision)
            self._probe()
            for sts in statefulsets:
                self._write_status(sts)
            self._write_dns()
            for job in self.items(f"/apis/batch/v1/namespaces/{self.ns}/jobs"):
                uid = job["metadata"]["uid"]
                if uid not in self.jobs and not (job.get("status") or {}).get("conditions"):
                    self.jobs[uid] = "running"
                    thread = threading.Thread(target=self._run_job, args=(job,), daemon=True)
                    self._job_threads.append(thread)
                    thread.start()

    def _write_dns(self) -> None:
        """The table the pods' resolver reads (``tests/chart/dns/sitecustomize.py``): every Service port, and every
        StatefulSet pod's port under its headless Service, to the local address of the pod behind it."""
        services = self.items(self._core("services"))
        statefulsets = self.items(self._apps("statefulsets")) if self.workloads else []
        deployments = self.items(self._apps("deployments")) if self.workloads else []
        # the table changes only with these objects (a pod's local ports are kept across its replacements)
        versions = [o["metadata"].get("resourceVersion") for o in (*services, *statefulsets, *deployments)]
        if versions == self._dns_versions:
            return
        routes: dict[str, str] = {}
        for svc in services:
            name = svc["metadata"]["name"]
            for port in svc["spec"].get("ports") or []:
                with contextlib.suppress(KeyError, ValueError):  # no pod behind it (yet): the name does not resolve
                    routes[f"{name}.{self.ns}.svc:{port['port']}"] = self.resolve_url(name, self.ns, port["port"])
                for sts in statefulsets:
                    if sts["spec"].get("serviceName") != name:
                        continue
                    for ordinal in range(sts["spec"].get("replicas", 1)):
                        pod = f"{sts['metadata']['name']}-{ordinal}"
                        with contextlib.suppress(KeyError, ValueError):
                            routes[f"{pod}.{name}.{self.ns}.svc:{port['port']}"] = self.resolve_pod_url(
                                pod, name, self.ns, port["port"]
                            )
        text = json.dumps(routes, sort_keys=True)
        if text != self._dns_text:
            partial = self.dns_table.with_suffix(".tmp")
            partial.write_text(text)
            partial.replace(self.dns_table)  # a pod reads the old table or the new one, never half of one
            self._dns_text = text
        self._dns_versions = versions

    def _owned(self, sts: dict[str, Any]) -> dict[int, PodRun]:
        name = sts["metadata"]["name"]
        return {
            int(pod.rsplit("-", 1)[1]): run
            for pod, run in self.pods.items()
            if run.kind == "StatefulSet" and run.owner == name
        }

    def _roll(self, sts: dict[str, Any]) -> None:
        """The StatefulSet controller's RollingUpdate: while every pod exists and is ready, delete the pod of the
        highest ordinal (at or above the partition) that is not at the update revision; the loop then creates it
        again from the update revision. One pod at a time, highest first. ``OnDelete`` leaves pods alone (one
        that is deleted comes back at the update revision). Simplified: pods below the partition are not rolled
        back to the current revision's template if deleted (they get the update revision, as under OnDelete)."""
        strategy = sts["spec"].get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate" or self.roll_budget == 0:
            return
        partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
        owned, replicas = self._owned(sts), sts["spec"].get("replicas", 1)
        if len(owned) < replicas or not all(run.ready for run in owned.values()):
            return  # as the controller does: no pod is replaced while one is missing or not ready
        revision = revision_of(sts)
        stale = [o for o, run in owned.items() if o >= partition and o < replicas and run.revision != revision]
        if stale:  # deleted with its grace period: the kubelet stops it, then the pod is made again
            victim = f"{sts['metadata']['name']}-{max(stale)}"
            self.api.delete(self._core("pods", victim))
            if self.roll_budget is not None:
                self.roll_budget -= 1

    def _write_status(self, sts: dict[str, Any]) -> None:
        """Status as the StatefulSet controller writes it (through the status subresource): the revisions, how
        many pods exist, are ready, are at the current and at the update revision. ``currentRevision`` becomes the
        update revision once every replica is at it (and ready)."""
        name, revision = sts["metadata"]["name"], revision_of(sts)
        owned, replicas = self._owned(sts), sts["spec"].get("replicas", 1)
        old = sts.get("status") or {}
        current = old.get("currentRevision") or revision
        updated = sum(run.revision == revision for run in owned.values())
        ready = sum(run.ready for run in owned.values())
        if updated == replicas == len(owned) and ready == replicas:
            current = revision
        status = {
            "observedGeneration": sts["metadata"].get("generation", 1),
            "replicas": len(owned),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": sum(run.revision == current for run in owned.values()),
            "updatedReplicas": updated,
            "currentRevision": current,
            "updateRevision": revision,
            "collisionCount": 0,
        }
        if {k: old.get(k) for k in status} != status:
            self.api.patch(
                self._apps("statefulsets", name) + "/status",
                json={"status": status},
                headers={"content-type": "application/merge-patch+json"},
            ).raise_for_status()

    def _start_pod(self, name: str, kind: str, owner: str, obj: dict[str, Any], revision: str) -> None:
        template = obj["spec"]["template"]  # a new pod is always made from the update revision (see _roll)
        annotations = dict(template["metadata"].get("annotations") or {})
        containers = template["spec"]["containers"]
        if "gym-checkpoint.dev/control-port" in annotations:
            annotations["gym-checkpoint.dev/control-port"] = str(
                self.port(name, int(annotations["gym-checkpoint.dev/control-port"]))
            )
        labels = dict(template["metadata"].get("labels") or {})
        metadata = {"name": name, "namespace": self.ns, "labels": labels, "annotations": annotations}
        if kind == "StatefulSet":  # as its controller does: the owner, and the ordinal as a label (Kubernetes >= 1.28)
            labels["apps.kubernetes.io/pod-index"] = name.rsplit("-", 1)[1]
            labels[REVISION_LABEL] = revision  # the revision it was made from
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": owner,
                    "uid": obj["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        # scheduled on the one node: its deletion is graceful (it stays Terminating for its grace period)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {**template["spec"], "nodeName": NODE}}
        resp = self.api.post(self._core("pods"), json=pod)
        if resp.status_code == 409:  # left over from a replaced one: replace it
            self._remove_pod(name)
            resp = self.api.post(self._core("pods"), json=pod)
        resp.raise_for_status()
        self._status(name, ready=False)
        run = PodRun(name=name, owner=owner, kind=kind, template=template, revision=revision, started=time.monotonic())
        pod_dir = self.workdir / "pods" / name
        pod_dir.mkdir(parents=True, exist_ok=True)
        mounts = self._volumes(name, owner, obj)
        credentials = self._credentials(name, template["spec"], pod_dir)
        for container in containers:
            argv, env = self._command(name, container, mounts, credentials)
            run.commands.append((argv, env, pod_dir / f"{container['name']}.log"))
            run.procs.append(self._spawn(argv, env, pod_dir, pod_dir / f"{container['name']}.log"))
        self.pods[name] = run

    def _remove_pod(self, name: str) -> None:
        """What the kubelet does once a pod's processes are gone: delete it with no grace left (it was scheduled, on
        node ``NODE``, so any other deletion leaves it Terminating for its grace period)."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        self.api.request("DELETE", self._core("pods", name), json=options)

    @staticmethod
    def _spawn(argv: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip

    def _credentials(self, pod: str, spec: dict[str, Any], pod_dir: Path) -> Path | None:
        """A kubeconfig with a token of the pod's ServiceAccount, if the pod mounts one (what the kubelet projects
        into /var/run/secrets/kubernetes.io/serviceaccount)."""
        account = spec.get("serviceAccountName") or "default"
        found = self.get(self._core("serviceaccounts", account))
        mounts = spec.get("automountServiceAccountToken")
        if mounts is None:
            mounts = (found or {}).get("automountServiceAccountToken", True)
        if not mounts or found is None:
            return None
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200},
        }
        resp = self.api.post(self._core("serviceaccounts", account) + "/token", json=request)
        resp.raise_for_status()
        return Path(self.kemu.kubeconfig_for(resp.json()["status"]["token"], pod_dir / "kubeconfig.yaml", self.ns))

    def _terminate(self, run: PodRun, pod: dict[str, Any]) -> None:
        """The kubelet stopping a deleted pod: SIGTERM to its containers at once, SIGKILL once the grace period is
        over; when they have exited, the pod is deleted for good (and its controller makes it again)."""
        if run.kill_at is None:
            grace = pod["metadata"].get("deletionGracePeriodSeconds") or 0
            run.kill_at, run.ready = time.monotonic() + float(grace), False
            for proc in run.procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
        if any(proc.poll() is None for proc in run.procs):
            if time.monotonic() < run.kill_at:
                return
            self._kill(run, signal.SIGKILL)
        self._remove_pod(run.name)
        del self.pods[run.name]

    def _restart_exited(self, run: PodRun) -> None:
        """``restartPolicy: Always``: a container that exited (a crash, an OOM kill, a server that held a final
        checkpoint and left) is started again in its pod, which is not Ready until its probe answers."""
        for i, proc in enumerate(run.procs):
            if proc.poll() is None:
                continue
            argv, env, log_path = run.commands[i]
            run.procs[i] = self._spawn(argv, env, log_path.parent, log_path)
            run.restarts += 1
            run.ready, run.started = False, time.monotonic()
            self._status(run.name, ready=False)

    def _status(self, name: str, ready: bool) -> None:
        status = {
            "status": {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            }
        }
        self.api.patch(
            self._core("pods", name) + "/status", json=status, headers={"content-type": "application/merge-patch+json"}
        )

    def _probe(self) -> None:
        for run in self.pods.values():
            if run.kind == "Job" or run.ready or run.kill_at is not None:
                continue
            if any(proc.poll() is not None for proc in run.procs):
                continue
            ok = True
            for container in run.template["spec"]["containers"]:
                probe = (container.get("readinessProbe") or {}).get("httpGet")
                if probe is None:
                    ok = ok and time.monotonic() - run.started > 1.0
                    continue
                port = self._named_port(run.name, container, probe["port"])
                try:
                    ok = ok and httpx.get(f"http://127.0.0.1:{port}{probe['path']}", timeout=1).status_code == 200
                except httpx.TransportError:
                    ok = False
            if ok:
                run.ready = True
                self._status(run.name, ready=True)

    def _run_job(self, job: dict[str, Any]) -> None:
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        template = job["spec"]["template"]
        pod_name = f"{name}-{uid[:5]}"
        pod_dir = self.workdir / "pods" / pod_name
        pod_dir.mkdir(parents=True, exist_ok=True)
        mounts = self._volumes(pod_name, name, job)
        (container,) = template["spec"]["containers"]
        credentials = self._credentials(pod_name, template["spec"], pod_dir)
        deadline = time.monotonic() + job["spec"].get("activeDeadlineSeconds", 600)
        code = 0
        with open(pod_dir / "job.log", "wb") as log:
            # as a kubelet: the init containers one after the other, each to success, then the container
            for each in [*template["spec"].get("initContainers", []), container]:
                argv, env = self._command(pod_name, each, mounts, credentials)
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=pod_dir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                try:
                    code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    code = -1
                if code != 0:
                    break
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        condition = {
            "type": "Complete" if code == 0 else "Failed",
            "status": "True",
            "lastTransitionTime": now,
            "lastProbeTime": now,
        }
        if code != 0:
            condition.update(reason="BackoffLimitExceeded", message=f"exit code {code}")
        status = {
            "status": {
                "startTime": now,
                "conditions": [condition],
                **({"succeeded": 1, "completionTime": now} if code == 0 else {"failed": 1}),
            }
        }
        self.api.patch(
            f"/apis/batch/v1/namespaces/{self.ns}/jobs/{name}/status",
            json=status,
            headers={"content-type": "application/merge-patch+json"},
        )
        self.jobs[uid] = "done"

    def job_log(self, name: str) -> str:
        return "\n".join(p.read_text(errors="replace") for p in (self.workdir / "pods").glob(f"{name}-*/job.log"))

    # --- translation: ports, DNS, volumes, commands ----------------------------------------------------------

    def port(self, pod: str, number: int) -> int:
        """The local port standing for ``number`` inside ``pod`` (stable across the pod's replacements)."""
        key = (pod, number)
        if key not in self.ports:
            taken = set(self.ports.values())
            taken |= {p + 10000 for p in taken} | {p - 10000 for p in taken}  # SeaweedFS's gRPC twins
            start = 12000 + (abs(hash(key)) % 1000) * 7
            for candidate in [*range(start, 22700), *range(12000, start)]:
                if (
                    candidate not in taken
                    and candidate + 10000 not in taken
                    and port_free(candidate)
                    and port_free(candidate + 10000)
                ):
                    self.ports[key] = candidate
                    break
            else:
                raise RuntimeError("no free port")
        return self.ports[key]

    def _named_port(self, pod: str, container: dict[str, Any], port: Any) -> int:
        if isinstance(port, int):
            return self.port(pod, port)
        for declared in container.get("ports") or []:
            if declared.get("name") == port:
                return self.port(pod, declared["containerPort"])
        raise KeyError(f"{pod}: no port named {port}")

    def resolve_url(self, service: str, namespace: str, number: int) -> str:
        """``<service>.<namespace>.svc:<number>`` -> 127.0.0.1:<the local port of the pod behind it>."""
        svc = self.get(f"/api/v1/namespaces/{namespace}/services/{service}")
        if svc is None:
            raise KeyError(f"no Service {namespace}/{service}")
        (port,) = [p for p in svc["spec"]["ports"] if p["port"] == number]
        selector = svc["spec"]["selector"]
        workloads = [(f"{sts['metadata']['name']}-0", sts) for sts in self.items(self._apps("statefulsets"))]
        workloads += [
            (f"{dep['metadata']['name']}-{_hash(dep['spec']['template'])[:5]}-0", dep)
            for dep in self.items(self._apps("deployments"))
        ]
        for pod, workload in workloads:
            labels = workload["spec"]["template"]["metadata"]["labels"]
            if selector.items() <= labels.items():
                for container in workload["spec"]["template"]["spec"]["containers"]:
                    try:
                        return f"127.0.0.1:{self._named_port(pod, container, port['targetPort'])}"
                    except KeyError:
                        continue
        raise KeyError(f"no pod behind Service {service}")

    def resolve_pod_url(self, pod: str, service: str, namespace: str, number: int) -> str:
        """``<pod>.<headless service>.<namespace>.svc:<number>`` -> 127.0.0.1:<that pod's local port>."""
        svc = self.get(f"/api/v1/namespaces/{namespace}/services/{service}")
        if svc is None:
            raise KeyError(f"no Service {namespace}/{service}")
        (port,) = [p for p in svc["spec"]["ports"] if p["port"] == number]
        for sts in self.items(self._apps("statefulsets")):
            if sts["spec"].get("serviceName") == service and pod.rsplit("-", 1)[0] == sts["metadata"]["name"]:
                for container in sts["spec"]["template"]["spec"]["containers"]:
                    try:
                        return f"127.0.0.1:{self._named_port(pod, container, port['targetPort'])}"
                    except KeyError:
                        continue
        raise KeyError(f"no pod {pod} under Service {service}")

    def dns(self, text: str) -> str:
        text = POD_URL.sub(
            lambda m: f"http://{self.resolve_pod_url(m.group(1), m.group(2), m.group(3), int(m.group(4)))}", text
        )
        return SVC_URL.sub(lambda m: f"http://{self.resolve_url(m.group(1), m.group(2), int(m.group(3)))}", text)

    def dns_value(self, text: str) -> str | list[str]:
        """Like :meth:`dns`; a URL naming a range of pods (``<sts>-{0..N-1}.<headless>...``) becomes the list of
        their local URLs, since no one local address stands for them all."""
        found = ORDINALS.search(text)
        if found is None:
            return self.dns(text)
        first, last = int(found.group(1)), int(found.group(2))
        return [self.dns(ORDINALS.sub(str(n), text, count=1)) for n in range(first, last + 1)]

    def _volumes(self, pod: str, owner: str, obj: dict[str, Any]) -> dict[str, Path]:
        """mountPath -> local folder, for the pod's first container mounts and every container's."""
        spec = obj["spec"]["template"]["spec"]
        local: dict[str, Path] = {}
        pod_dir = self.workdir / "pods" / pod
        for volume in spec.get("volumes") or []:
            folder = pod_dir / "volumes" / volume["name"]
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            if "configMap" in volume:
                config_map = self.get(self._core("configmaps", volume["configMap"]["name"]))
                for key, text in (config_map or {}).get("data", {}).items():
                    (folder / key).write_text(text)
            local[volume["name"]] = folder
        for claim in obj["spec"].get("volumeClaimTemplates") or []:
            folder = self.workdir / "pvc" / f"{claim['metadata']['name']}-{pod}"  # outlives the pod
            folder.mkdir(parents=True, exist_ok=True)
            local[claim["metadata"]["name"]] = folder
        mounts: dict[str, Path] = {}
        for container in spec["containers"]:
            for mount in container.get("volumeMounts") or []:
                mounts[mount["mountPath"]] = local[mount["name"]]
        # server configs name mount paths too (data_dir: /data) and other servers by DNS
        for folder in mounts.values():
            for path in folder.glob("*.yaml"):
                config = yaml.safe_load(path.read_text()) or {}
                path.write_text(yaml.safe_dump(self._localize(config, mounts)))
        return mounts

    def _localize(self, value: Any, mounts: dict[str, Path]) -> Any:
        if isinstance(value, dict):
            return {k: self._localize(v, mounts) for k, v in value.items()}
        if isinstance(value, list):
            return [self._localize(v, mounts) for v in value]
        if isinstance(value, str):
            for mount_path, folder in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                if value == mount_path or value.startswith(mount_path + "/"):
                    return str(folder) + value[len(mount_path) :]
            return self.dns_value(value)
        return value

    def _command(
        self, pod: str, container: dict[str, Any], mounts: dict[str, Path], credentials: Path | None
    ) -> tuple[list[str], dict[str, str]]:
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        program = {
            "gymckpt": str(BIN / "gymckpt"),
            "gym-operator": str(BIN / "gym-operator"),
            "weed": weed_binary(),
        }.get(argv[0])
        if program is None:
            raise RuntimeError(f"{pod}: no local program for {argv[0]}")
        out = [program]
        rest = argv[1:]
        i = 0
        while i < len(rest):
            arg = rest[i]
            if arg in PORT_FLAGS and i + 1 < len(rest):
                out += [arg, str(self.port(pod, int(rest[i + 1])))]
                i += 2
                continue
            if arg == "--host" and i + 1 < len(rest):
                out += [arg, "127.0.0.1"]
                i += 2
                continue
            # HOST:PORT and URLs with a port (forwarder, gym-operator --liveness), -x.port=N (SeaweedFS)
            arg = re.sub(
                r"^(0\.0\.0\.0|127\.0\.0\.1):(\d+)$", lambda m: f"127.0.0.1:{self.port(pod, int(m.group(2)))}", arg
            )
            arg = re.sub(
                r"^http://0\.0\.0\.0:(\d+)", lambda m: f"http://127.0.0.1:{self.port(pod, int(m.group(1)))}", arg
            )
            arg = re.sub(
                r"^(-[a-z0-9.]+\.port)=(\d+)$", lambda m: f"{m.group(1)}={self.port(pod, int(m.group(2)))}", arg
            )
            for mount_path, folder in sorted(mounts.items(), key=lambda kv: -len(kv[0])):  # one mount, the longest
                localized = re.sub(
                    rf"(^|=){re.escape(mount_path)}(?=/|$)", r"\g<1>" + str(folder).replace("\\", "\\\\"), arg
                )
                if localized != arg:
                    arg = localized
                    break
            out.append(self.dns(arg))
            i += 1
        env = {
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
            "HOME": str(self.workdir / "pods" / pod),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(DNS_RESOLVER),  # cluster DNS for the names a pod reads at run time (_write_dns)
            "GYMCKPT_CLUSTER_DNS": str(self.dns_table),
            **({"KUBECONFIG": str(credentials)} if credentials else {}),
        }
        for item in container.get("env") or []:
            env[item["name"]] = self._env_value(pod, item)
        return out, env

    def _env_value(self, pod: str, item: dict[str, Any]) -> str:
        if "value" in item:
            return self.dns(str(item["value"]))
        source = item["valueFrom"]
        if "secretKeyRef" in source:
            return self.secret_value(source["secretKeyRef"]["name"], source["secretKeyRef"]["key"])
        path = source["fieldRef"]["fieldPath"]
        return {"metadata.name": pod, "metadata.namespace": self.ns}[path]

    # --- what a test does ----------------------------------------------------------------------------------

    def wait_ready(self, names: set[str] | None = None, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                runs = {n: r for n, r in self.pods.items() if names is None or n in names}
                looping = {n: r for n, r in runs.items() if r.restarts > 3}  # (the kubelet restarts one that exits)
                if looping:
                    raise AssertionError(f"pods crash-looping: {sorted(looping)}\n" + self.logs(*looping))
                if runs and (names is None or set(runs) == names) and all(r.ready for r in runs.values()):
                    return
            time.sleep(0.2)
        raise AssertionError(
            f"not ready in {timeout_s}s: {[n for n, r in self.pods.items() if not r.ready]}; errors {self.errors[-3:]}"
        )

    def replace_pods(self, names: list[str]) -> None:
        """What a node failure does: the processes die (SIGKILL) and the pods are deleted without grace; the
        StatefulSet controller then creates fresh pods of the same names (with the same volumes)."""
        with self._lock:
            for name in names:
                run = self.pods.pop(name)
                self._kill(run, signal.SIGKILL)
                self._remove_pod(name)

    def crash(self, name: str) -> None:
        """A container killed in place (SIGKILL: an OOM kill, a segfault): the kubelet restarts it in its pod."""
        with self._lock:
            self._kill(self.pods[name], signal.SIGKILL)

    def local_url(self, pod: str, port_name: str = "http") -> str:
        run = self.pods[pod]
        return f"http://127.0.0.1:{self._named_port(pod, run.template['spec']['containers'][0], port_name)}"

    def read_object(self, location: str, key: str) -> bytes:
        """One object under a checkpoint location (``s3://bucket/prefix``), read as the operator reads it: with the
        endpoint and the Secret of the CheckpointStorageLocation at that URL (no server pod has keys)."""
        import boto3

        bucket, _, prefix = location.removeprefix("s3://").partition("/")
        path = f"/apis/gym-checkpoint.dev/v1alpha1/namespaces/{self.ns}/checkpointstoragelocations"
        (spec,) = [
            loc["spec"]
            for loc in self.items(path)
            if loc["spec"].get("bucket") == bucket and loc["spec"].get("prefix", "").strip("/") == prefix
        ]
        secret = spec["credential"]["name"]
        s3 = boto3.client(
            "s3",
            endpoint_url=self.dns(spec["endpoint"]),
            region_name=spec.get("region", "us-east-1"),
            aws_access_key_id=self.secret_value(secret, "AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=self.secret_value(secret, "AWS_SECRET_ACCESS_KEY"),
        )
        return s3.get_object(Bucket=bucket, Key=f"{prefix}/{key}" if prefix else key)["Body"].read()

    def logs(self, *pods: str) -> str:
        out = []
        for pod in pods:
            for path in sorted((self.workdir / "pods" / pod).glob("*.log")):
                out.append(f"--- {path.name} of {pod}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def _kill(self, run: PodRun, sig: int) -> None:
        for proc in run.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
        for proc in run.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
