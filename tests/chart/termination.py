"""What the termination tests on the emulated cluster share: the chart installed with two counter servers (one
release, the operator of the chart under the chart's own RBAC), sessions the tests seed and continue, and what the
API says about the release's Checkpoints, Restores and Events."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.chart.cluster import Cluster
from tests.chart.test_helm_install import helm_call

helm = pytest.importorskip("helm_python")

RELEASE = "gym"
PODS = ("gym-gym-checkpoint-counter-0", "gym-gym-checkpoint-other-0")
#: two participants, so that one pod going shows the checkpoint covers the whole stack; short timings for a test
VALUES: dict[str, Any] = {
    "servers": [
        {"name": "counter", "server": "counter", "role": "resources"},
        {"name": "other", "server": "counter", "role": "resources"},
    ],
    "rollouts": {"enabled": False},
    "operator": {"replicas": 1},
    "termination": {"gracePeriodSeconds": 40, "marginSeconds": 10, "leaseSeconds": 5},
}
CREATED_BY = "gym-checkpoint.dev/created-by"


def install(kemu: Any, values: dict[str, Any] = VALUES, upgrade: bool = False) -> dict[str, Any]:
    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace="default")
    try:
        return helm_call(cfg, "helm_upgrade" if upgrade else "helm_install", RELEASE, values, timeout_seconds=60)
    finally:
        cfg.close()


def wait_for(check: Any, timeout: float, what: str, cluster: Cluster | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    logs = cluster.logs(*[n for n in cluster.pods if "operator" in n]) if cluster else ""
    raise AssertionError(f"{what} not reached in {timeout}s\n{logs[-6000:]}")


def items(kubectl: Any, kind: str, selector: str | None = None) -> list[dict[str, Any]]:
    args = ["get", kind, "-o", "json"] + (["-l", selector] if selector else [])
    return list(json.loads(kubectl(*args).stdout)["items"])


def named(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in found}


def phase(obj: dict[str, Any]) -> str | None:
    return (obj.get("status") or {}).get("phase")


def events_of(kubectl: Any, name: str) -> list[tuple[str, str]]:
    events = items(kubectl, "events")
    return [(e["reason"], e["message"]) for e in events if e["involvedObject"]["name"] == name]


class Sessions:
    """One live session per counter server (rollout ``r-<pod>``), continued after every restore as the attempt the
    Restore says."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.values: dict[str, int] = {}
        self.cookies: dict[str, dict[str, str]] = {}
        self.attempt = 0

    def seed(self, starts: dict[str, int]) -> None:
        for pod, start in starts.items():
            with httpx.Client(base_url=self.cluster.local_url(pod)) as http:
                http.post("/seed_session", json={"start": start}, headers=self._headers(pod)).raise_for_status()
                self.cookies[pod] = dict(http.cookies)
            self.values[pod] = start

    def _headers(self, pod: str) -> dict[str, str]:
        return {"x-ng-rollout-id": f"r-{pod}", "x-ng-attempt": str(self.attempt)}

    def increment(self) -> None:
        """Each session one step further, at the current attempt; the answer is the value it held plus one."""
        for pod in self.values:
            with httpx.Client(base_url=self.cluster.local_url(pod), cookies=self.cookies[pod]) as http:
                answer = http.post("/increment", json={"by": 1}, headers=self._headers(pod))
                assert answer.status_code == 200, (pod, answer.status_code, answer.text)
                self.values[pod] += 1
                assert answer.json() == {"output": self.values[pod]}, pod

    def resumed(self, attempt: int) -> None:
        """After a restore: the attempt before it is stale on every server, and each session continues."""
        for pod in self.values:
            with httpx.Client(base_url=self.cluster.local_url(pod), cookies=self.cookies[pod]) as http:
                stale = http.post("/increment", json={"by": 1}, headers=self._headers(pod))
                assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt", stale.text
        self.attempt = attempt
        self.increment()


def terminations(kubectl: Any) -> dict[str, dict[str, Any]]:
    return named(items(kubectl, "checkpoints", f"{CREATED_BY}=termination"))


def automatic_restores(kubectl: Any) -> dict[str, dict[str, Any]]:
    return named(items(kubectl, "restores", f"{CREATED_BY}=auto-restore"))


def gone(kubectl: Any, pod: str, uid: str) -> bool:
    found = kubectl("get", "pod", pod, "-o", "json", check=False)
    return found.returncode != 0 or json.loads(found.stdout)["metadata"]["uid"] != uid


def server_log(cluster: Cluster, workdir: Path, pod: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((workdir / "pods" / pod).glob("*.log")))
