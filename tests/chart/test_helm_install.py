"""`helm install`, `upgrade` and `uninstall` of the chart into the API emulator (kemu), with real Helm 4.

Install and upgrade go through helm-python-sdk's C ABI (its Python `install()` takes no values file
path) with OpenAPI validation on: kemu serves the OpenAPI v3 documents Helm's client reads, so Helm
sends every manifest with `fieldValidation=Strict`, as against a real cluster. Release records use
Helm's default Secret storage (sent as protobuf; kemu decodes it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.chart.cluster import Cluster

pytestmark = pytest.mark.k8s

helm = pytest.importorskip("helm_python")

CHART = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint"
NS = "default"


def helm_call(
    cfg: Any,
    action: str,
    release: str,
    values: dict[str, Any],
    timeout_seconds: int = 20,
    chart: Path = CHART,
    **options: Any,
) -> dict[str, Any]:
    from helm_python import _native
    from helm_python.config import _NONE, _opts

    raw = _native.call_string(
        action,
        cfg._raw(),
        _native.HANDLE(_NONE),
        _native.HANDLE(_NONE),
        str(chart),
        release,
        json.dumps(values),
        _opts(timeout_seconds=timeout_seconds, **options),
    )
    return json.loads(raw)


def names(api: httpx.Client, path: str) -> set[str]:
    response = api.get(path)
    assert response.status_code == 200, response.text
    return {item["metadata"]["name"] for item in response.json()["items"]}


def test_install_upgrade_uninstall(kemu: Any, tmp_path: Path) -> None:
    """With Helm's hooks: the secrets hook Job (run by the emulated cluster) makes the generated Secret before
    anything else, an upgrade keeps its values, and the post-delete hook removes it after uninstall."""
    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace=NS)
    api = kemu.client()
    jobs = Cluster(kemu, tmp_path / "cluster", workloads=False).__enter__()
    try:
        installed = helm_call(cfg, "helm_install", "demo", {}, timeout_seconds=180)
        assert installed["status"] == "deployed" and installed["revision"] == 1

        servers = {
            f"demo-gym-checkpoint-{name}"
            for name in ("inference-worker", "policy-model", "workplace-assistant", "simple-agent", "collection")
        }
        assert names(api, f"/apis/apps/v1/namespaces/{NS}/statefulsets") == servers | {"demo-gym-checkpoint-s3"}
        assert servers <= names(api, f"/api/v1/namespaces/{NS}/services")
        assert {f"{name}-headless" for name in servers} <= names(api, f"/api/v1/namespaces/{NS}/services")
        assert {f"{name}-config" for name in servers} <= names(api, f"/api/v1/namespaces/{NS}/configmaps")
        assert names(api, f"/apis/apps/v1/namespaces/{NS}/deployments") == {"demo-gym-checkpoint-operator"}
        assert names(api, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles") == {
            "demo-gym-checkpoint-operator"
        }
        assert "demo-gym-checkpoint-operator" in names(api, f"/api/v1/namespaces/{NS}/serviceaccounts")
        secrets = names(api, f"/api/v1/namespaces/{NS}/secrets")
        assert secrets == {"demo-gym-checkpoint-generated", "demo-gym-checkpoint-storage", "sh.helm.release.v1.demo.v1"}
        generated = api.get(f"/api/v1/namespaces/{NS}/secrets/demo-gym-checkpoint-generated").json()
        assert set(generated["data"]) == {"token", "secret"}  # the servers' Secret: no storage key
        storage = api.get(f"/api/v1/namespaces/{NS}/secrets/demo-gym-checkpoint-storage").json()
        assert set(storage["data"]) == {"gateway-key", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        # not app.kubernetes.io/instance, which Argo CD 2.x tracks by (it would prune a Secret it did not render)
        for secret in (generated, storage):
            assert secret["metadata"]["labels"]["gym-checkpoint.dev/release"] == "demo"
            assert "app.kubernetes.io/instance" not in secret["metadata"]["labels"]
        # the hook's own objects are gone once it succeeded
        assert not names(api, f"/apis/batch/v1/namespaces/{NS}/jobs")
        assert "demo-gym-checkpoint-secrets" not in names(api, f"/api/v1/namespaces/{NS}/serviceaccounts")
        assert names(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions") == {
            "checkpoints.gym-checkpoint.dev",
            "checkpointstoragelocations.gym-checkpoint.dev",
            "checkpointschedules.gym-checkpoint.dev",
            "restores.gym-checkpoint.dev",
        }
        locations = names(api, f"/apis/gym-checkpoint.dev/v1alpha1/namespaces/{NS}/checkpointstoragelocations")
        assert locations == {"demo-gym-checkpoint-default"}
        assert api.get(f"/apis/gym-checkpoint.dev/v1alpha1/namespaces/{NS}/checkpoints").status_code == 200

        upgraded = helm_call(cfg, "helm_upgrade", "demo", {"operator": {"logLevel": "debug"}}, timeout_seconds=180)
        assert upgraded["revision"] == 2
        again = api.get(f"/api/v1/namespaces/{NS}/secrets/demo-gym-checkpoint-generated").json()
        assert again["data"] == generated["data"]  # the pre-upgrade hook ran and changed nothing
        operator = api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/demo-gym-checkpoint-operator").json()
        assert "--verbose" in operator["spec"]["template"]["spec"]["containers"][0]["command"]
        assert operator["metadata"]["generation"] == 2
        releases = {(r["name"], r["revision"], r["status"]) for r in cfg.history("demo")}
        assert releases == {("demo", 1, "superseded"), ("demo", 2, "deployed")}

        cfg.uninstall("demo")
        assert names(api, f"/apis/apps/v1/namespaces/{NS}/statefulsets") == set()
        assert names(api, f"/apis/apps/v1/namespaces/{NS}/deployments") == set()
        assert not servers & names(api, f"/api/v1/namespaces/{NS}/services")
        assert names(api, f"/api/v1/namespaces/{NS}/secrets") == set()  # the generated one too (post-delete hook)
        assert names(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions") == {
            "checkpoints.gym-checkpoint.dev",
            "checkpointstoragelocations.gym-checkpoint.dev",
            "checkpointschedules.gym-checkpoint.dev",
            "restores.gym-checkpoint.dev",
        }
        locations = names(api, f"/apis/gym-checkpoint.dev/v1alpha1/namespaces/{NS}/checkpointstoragelocations")
        assert locations == set()  # the release's storage locations go with it; the CRDs stay, as in Helm
    finally:
        jobs.close()
        api.close()
        cfg.close()


def test_kubectl_applies_the_notes_examples_after_install(kemu: Any, kubectl: Any) -> None:
    """The Checkpoint and Restore of NOTES.txt are accepted by the installed CRDs."""
    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace=NS)
    try:
        notes = helm_call(
            cfg,
            "helm_install",
            "demo",
            {"storage": {"embedded": {"enabled": False}, "location": "s3://ckpts/demo"}},
            disable_hooks=True,
        )["notes"]
    finally:
        cfg.close()
    blocks = [block.split("  YAML")[0] for block in notes.split("<<'YAML' | kubectl apply -n default -f -\n")[1:]]
    assert len(blocks) == 2
    for block in blocks:
        manifest = "\n".join(line[2:] for line in block.splitlines())
        kubectl("apply", "-f", "-", input=manifest)
    out = kubectl("get", "checkpoints,restores").stdout
    assert "ckpt-1" in out and "restore-1" in out


def test_helm_validates_manifests_against_the_servers_schema(kemu: Any, tmp_path: Path) -> None:
    """Helm 4 installs with server-side apply, which refuses a field the CRD does not declare as a real API server
    does (structured-merge-diff: `failed to create typed patch object ...: .spec.x: field not declared in schema`)."""
    chart = tmp_path / "typo"
    (chart / "templates").mkdir(parents=True)
    (chart / "crds").mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: typo\nversion: 0.1.0\n")
    (chart / "crds" / "checkpoints.yaml").write_text((CHART / "crds" / "checkpoints.yaml").read_text())
    (chart / "templates" / "checkpoint.yaml").write_text(
        "apiVersion: gym-checkpoint.dev/v1alpha1\nkind: Checkpoint\nmetadata:\n  name: typo\n"
        "spec:\n  prepareTimeoutSecond: 30\n"
    )
    cfg = helm.Config(kubeconfig_path=str(kemu.kubeconfig), namespace=NS)
    try:
        with pytest.raises(Exception) as failure:
            helm_call(cfg, "helm_install", "typo", {}, chart=chart)
    finally:
        cfg.close()
    assert ".spec.prepareTimeoutSecond: field not declared in schema" in str(failure.value)
