"""A CRD schema change across `helm upgrade` (gym_operator.crdcheck, gym_operator.probes, gym_operator.crdupgrade), on
the emulated cluster (tests/chart/cluster.py: the operator's pods and the hooks' Jobs run as processes under the
chart's ServiceAccounts and Roles). Helm never upgrades crds/: an operator over older CRDs neither crash-loops nor
leads, it stays unready and says why; the chart's pre-upgrade hook (crds.upgrade, as Velero's upgradeCRDs) applies
the chart's CRDs, and the same pod turns ready and leads."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from tests.chart.cluster import Cluster
from tests.chart.test_helm_install import CHART, helm_call

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]

helm = pytest.importorskip("helm_python")

NS = "default"
VALUES = {
    "servers": [{"name": "inference-worker", "server": "inference_worker", "participant": False, "port": 8000}],
    "rollouts": {"enabled": False},
    "networkPolicy": {"enabled": False},
    "storage": {"embedded": {"enabled": False}, "location": "file:///tmp/gym-crd-upgrade"},
    "operator": {"replicas": 1},
}


def older_crd() -> dict[str, Any]:
    """The Checkpoint CRD of an older chart: no spec.deletionPolicy, an older schema-version."""
    crd = yaml.safe_load((CHART / "crds" / "checkpoints.yaml").read_text())
    crd["metadata"]["annotations"]["gym-checkpoint.dev/schema-version"] = "1"
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del schema["properties"]["deletionPolicy"]
    schema["x-kubernetes-validations"] = [
        rule for rule in schema.get("x-kubernetes-validations", []) if "deletionPolicy" not in rule["rule"]
    ]
    return crd


def readiness(cluster: Cluster, pod: str) -> tuple[int, dict[str, Any]]:
    try:
        answer = httpx.get(f"http://127.0.0.1:{cluster.port(pod, 8080)}/readyz", timeout=5)
    except httpx.TransportError:
        return 0, {}
    return answer.status_code, answer.json()


def operator_pod(cluster: Cluster, not_this: str = "") -> str:
    found = [name for name in cluster.pods if "-operator-" in name and name != not_this]
    return found[0] if len(found) == 1 else ""


def test_an_operator_over_older_crds_waits_unready_until_the_upgrade_hook_applies_them(
    kemu: Any, kubectl: Any, tmp_path: Path
) -> None:
    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace=NS)
    try:
        with Cluster(kemu, tmp_path / "cluster", namespace=NS) as cluster:
            assert helm_call(cfg, "helm_install", "gym", VALUES, timeout_seconds=120)["status"] == "deployed"
            first = _wait(lambda: operator_pod(cluster), "the operator pod")
            _wait(lambda: readiness(cluster, first)[0] == 200, "the first operator to be ready")
            # someone applies the CRDs of an older chart (or the upgrade below skips the CRDs hook)
            kubectl("replace", "-f", "-", input=yaml.safe_dump(older_crd()))
            upgrade = {**VALUES, "crds": {"upgrade": False}, "operator": {"replicas": 1, "logLevel": "debug"}}
            assert helm_call(cfg, "helm_upgrade", "gym", upgrade, timeout_seconds=120)["revision"] == 2
            second = _wait(lambda: operator_pod(cluster, not_this=first), "the new operator pod")
            _code, answer = _wait(
                lambda: (r := readiness(cluster, second))[0] == 503 and "not checked yet" not in r[1]["reason"] and r,
                "its readiness to answer after its first CRD check",
            )
            assert "Checkpoint has no spec.deletionPolicy" in answer["reason"] and answer["leader"] is False, answer
            time.sleep(3.0)
            assert all(p.poll() is None for p in cluster.pods[second].procs), "it must not crash (no crash loop)"
            lease = json.loads(kubectl("get", "lease", "gym-gym-checkpoint-operator", "-o", "json").stdout)
            assert lease["spec"].get("holderIdentity") in (None, "") or second not in lease["spec"]["holderIdentity"]
            assert "not competing for the leadership" in cluster.logs(second)

            upgrade["crds"] = {"upgrade": True}  # the chart's default: its pre-upgrade hook applies the CRDs
            assert helm_call(cfg, "helm_upgrade", "gym", upgrade, timeout_seconds=120)["revision"] == 3
            assert "checkpoints.gym-checkpoint.dev: replaced (schema-version 1 ->" in cluster.job_log(
                "gym-gym-checkpoint-crds"
            )
            _wait(lambda: readiness(cluster, second)[0] == 200, "the same pod to turn ready", timeout=60)
            assert readiness(cluster, second)[1]["leader"] is True
            installed = json.loads(kubectl("get", "crd", "checkpoints.gym-checkpoint.dev", "-o", "json").stdout)
            chart = yaml.safe_load((CHART / "crds" / "checkpoints.yaml").read_text())
            assert installed["metadata"]["annotations"] == chart["metadata"]["annotations"]
            audit = kemu.audit(user=f"system:serviceaccount:{NS}:gym-gym-checkpoint-crds")
            assert audit and not [e for e in audit if e["code"] in (401, 403)], audit
    finally:
        cfg.close()


def _wait(check: Any, what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"{what} not reached in {timeout}s")
