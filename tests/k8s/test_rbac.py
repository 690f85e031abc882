"""kemu authenticates bearer tokens and authorizes with RBAC, as kube-apiserver does; each test names the rule.

ServiceAccount tokens come from the TokenRequest API (`kubectl create token`), the path a real cluster
uses; the harness's admin (`kemu-test-token`, group system:masters) sets things up. The Roles of the
project's chart are checked as rendered by Helm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kemu.fixtures import make_kubectl

pytestmark = pytest.mark.k8s

CHART = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint"
CRDS = CHART / "crds"
GROUP = "gym-checkpoint.dev"


def sa_token(kubectl: Any, namespace: str, name: str) -> str:
    """A TokenRequest token for the ServiceAccount (created if missing), as `kubectl create token` gets one."""
    if kubectl("-n", namespace, "get", "serviceaccount", name, check=False).returncode != 0:
        kubectl("-n", namespace, "create", "serviceaccount", name)
    return kubectl("-n", namespace, "create", "token", name).stdout.strip()


@pytest.fixture(scope="module")
def cluster(kemu_shared: Any, kubectl_shared: Any) -> Any:
    kubectl_shared("apply", "-f", str(CRDS))
    kubectl_shared("create", "namespace", "team")
    kubectl_shared(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump_all(
            [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "checkpoint-writer", "namespace": "team"},
                    "rules": [
                        {"apiGroups": [GROUP], "resources": ["checkpoints"], "verbs": ["get", "list", "create"]},
                        {"apiGroups": [GROUP], "resources": ["checkpoints/status"], "verbs": ["patch"]},
                        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["allowed"]},
                    ],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "writer", "namespace": "team"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "checkpoint-writer"},
                    "subjects": [{"kind": "ServiceAccount", "name": "writer", "namespace": "team"}],
                },
            ]
        ),
    )
    for name in ("allowed", "other"):
        kubectl_shared("-n", "team", "create", "secret", "generic", name, "--from-literal=k=v")
    return kemu_shared


def test_requests_without_a_token_are_anonymous_and_a_bad_token_is_401(cluster: Any) -> None:
    """No credentials: user system:anonymous (group system:unauthenticated), which RBAC lets read /version only
    (system:public-info-viewer); a token that does not verify: 401 Unauthorized."""
    with cluster.client(token=None) as anonymous:
        assert anonymous.get("/version").status_code == 200
        refused = anonymous.get("/api/v1/namespaces/default/pods")
        assert refused.status_code == 403
        assert refused.json()["message"] == (
            'pods is forbidden: User "system:anonymous" cannot list resource "pods" '
            'in API group "" in the namespace "default"'
        )
        assert anonymous.get("/apis").status_code == 403  # discovery is for system:authenticated
    with cluster.client(token="not-a-token") as forged:
        unauthorized = forged.get("/api/v1/namespaces/default/pods")
    assert unauthorized.status_code == 401
    assert unauthorized.json() | {"metadata": {}} == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


def test_service_account_token_is_checked_against_role_verbs_and_subresources(
    cluster: Any, kubectl_shared: Any
) -> None:
    """A RoleBinding grants its Role's verbs on exactly the listed resources (`checkpoints/status` is not
    `checkpoints`), in its namespace only; a denial is 403 Forbidden with the real message and details."""
    token = sa_token(kubectl_shared, "team", "writer")
    base = f"/apis/{GROUP}/v1alpha1/namespaces/team/checkpoints"
    with cluster.client(token=token) as writer:
        body = {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "Checkpoint",
            "metadata": {"name": "c1"},
            "spec": {"release": "gym"},
        }
        assert writer.post(base, json=body).status_code == 201
        assert writer.get(base).status_code == 200
        patched = writer.patch(
            f"{base}/c1/status",
            headers={"Content-Type": "application/merge-patch+json"},
            content='{"status": {"phase": "Pending"}}',
        )
        assert patched.status_code == 200, patched.text
        denied = writer.patch(
            f"{base}/c1",
            headers={"Content-Type": "application/merge-patch+json"},
            content='{"spec": {"leaseSeconds": 9}}',
        )
        assert denied.status_code == 403
        assert denied.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "reason": "Forbidden",
            "code": 403,
            "details": {"name": "c1", "group": GROUP, "kind": "checkpoints"},
            "message": 'checkpoints.gym-checkpoint.dev "c1" is forbidden: User "system:serviceaccount:team:writer" '
            'cannot patch resource "checkpoints" in API group "gym-checkpoint.dev" in the namespace "team"',
        }
        assert writer.delete(f"{base}/c1").status_code == 403
        other_ns = writer.get(f"/apis/{GROUP}/v1alpha1/namespaces/default/checkpoints")
        assert other_ns.status_code == 403 and 'in the namespace "default"' in other_ns.json()["message"]
        assert writer.get(f"/apis/{GROUP}/v1alpha1/checkpoints").json()["message"].endswith("at the cluster scope")
        assert writer.get("/apis").status_code == 200  # system:discovery, bound to system:authenticated


def test_resource_names_restrict_to_the_named_objects(cluster: Any, kubectl_shared: Any) -> None:
    """`resourceNames` allow the listed objects only, and never a list (which names no object)."""
    token = sa_token(kubectl_shared, "team", "writer")
    with cluster.client(token=token) as writer:
        assert writer.get("/api/v1/namespaces/team/secrets/allowed").status_code == 200
        other = writer.get("/api/v1/namespaces/team/secrets/other")
        assert other.status_code == 403 and other.json()["details"] == {"name": "other", "kind": "secrets"}
        assert writer.get("/api/v1/namespaces/team/secrets").status_code == 403


def test_cluster_roles_bound_by_role_and_cluster_role_bindings_and_aggregation(
    cluster: Any, kubectl_shared: Any
) -> None:
    """A ClusterRole bound by a RoleBinding grants in that namespace only, by a ClusterRoleBinding everywhere;
    an aggregated ClusterRole gets the rules of the ClusterRoles its selector matches; a binding to a missing
    role grants nothing and says so."""
    token = sa_token(kubectl_shared, "team", "reader")
    kubectl_shared(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump_all(
            [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": "pod-reader", "labels": {"kemu.test/aggregate": "true"}},
                    "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": "aggregate"},
                    "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"kemu.test/aggregate": "true"}}]},
                    "rules": [],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "reader", "namespace": "team"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "aggregate"},
                    "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "team"}],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "reader-missing"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "no-such-role"},
                    "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "team"}],
                },
            ]
        ),
    )
    with cluster.client(token=token) as reader:
        assert reader.get("/api/v1/namespaces/team/pods").status_code == 200
        elsewhere = reader.get("/api/v1/namespaces/default/pods")
        assert elsewhere.status_code == 403
        assert elsewhere.json()["message"].endswith(
            ': RBAC: clusterrole.rbac.authorization.k8s.io "no-such-role" not found'
        )
    kubectl_shared(
        "create", "clusterrolebinding", "reader-everywhere", "--clusterrole=pod-reader", "--serviceaccount=team:reader"
    )
    with cluster.client(token=token) as reader:
        assert reader.get("/api/v1/namespaces/default/pods").status_code == 200
        assert reader.get("/api/v1/pods").status_code == 200


def test_kubectl_auth_can_i_and_whoami_with_a_service_account(
    cluster: Any, kubectl_shared: Any, tmp_path: Path
) -> None:
    """kubectl sends the token as a bearer token over TLS; SelfSubjectAccessReview and SelfSubjectReview answer
    from the same authorizer."""
    token = sa_token(kubectl_shared, "team", "asker")
    kubectl_shared(
        "-n", "team", "create", "rolebinding", "asker", "--role=checkpoint-writer", "--serviceaccount=team:asker"
    )
    as_sa = make_kubectl(
        cluster._replace(kubeconfig=cluster.kubeconfig_for(token, tmp_path / "sa.yaml", "team")), tmp_path
    )
    assert as_sa("auth", "can-i", "create", "checkpoints.gym-checkpoint.dev").stdout.strip() == "yes"
    assert as_sa("auth", "can-i", "delete", "checkpoints.gym-checkpoint.dev", check=False).stdout.strip() == "no"
    assert (
        as_sa("auth", "can-i", "patch", "checkpoints.gym-checkpoint.dev", "--subresource=status").stdout.strip()
        == "yes"
    )
    assert "system:serviceaccount:team:asker" in as_sa("auth", "whoami").stdout
    denied = as_sa("get", "pods", check=False)
    assert (
        denied.returncode != 0
        and "Error from server (Forbidden): pods is forbidden: User "
        '"system:serviceaccount:team:asker" cannot list resource "pods"'
        in denied.stderr
    )


def test_tokens_die_with_their_service_account(cluster: Any, kubectl_shared: Any) -> None:
    """TokenRequest tokens are bound to the ServiceAccount's uid: deleting it makes them 401; a legacy
    `kubernetes.io/service-account-token` Secret is filled in by the token controller."""
    token = sa_token(kubectl_shared, "team", "shortlived")
    kubectl_shared(
        "-n",
        "team",
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/service-account-token",
                "metadata": {
                    "name": "shortlived-token",
                    "annotations": {"kubernetes.io/service-account.name": "shortlived"},
                },
            }
        ),
    )
    secret_token = kubectl_shared(
        "-n", "team", "get", "secret", "shortlived-token", "-o", "jsonpath={.data.token}"
    ).stdout
    import base64

    legacy = base64.b64decode(secret_token).decode()
    for each in (token, legacy):
        with cluster.client(token=each) as client:
            assert client.get("/apis").status_code == 200
    kubectl_shared("-n", "team", "delete", "serviceaccount", "shortlived")
    for each in (token, legacy):
        with cluster.client(token=each) as client:
            assert client.get("/apis").status_code == 401


def test_the_charts_operator_role_as_rendered_by_helm(cluster: Any, kubectl_shared: Any) -> None:
    """The chart's operator Role and RoleBinding, installed as Helm renders them, grant the operator's
    ServiceAccount what the Role lists in the release namespace and nothing else."""
    helm = pytest.importorskip("helm_python")
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render({}, name="demo", namespace="team")
    docs = [doc for doc in yaml.safe_load_all(files["gym-checkpoint/templates/operator.yaml"]) if doc]
    rbac = [doc for doc in docs if doc["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    assert {doc["kind"] for doc in rbac} == {"ServiceAccount", "Role", "RoleBinding"}
    for doc in rbac:
        doc["metadata"]["namespace"] = "team"
    kubectl_shared("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    sa = next(doc for doc in rbac if doc["kind"] == "ServiceAccount")["metadata"]["name"]
    token = kubectl_shared("-n", "team", "create", "token", sa).stdout.strip()
    base = f"/apis/{GROUP}/v1alpha1/namespaces/team"
    merge = {"Content-Type": "application/merge-patch+json"}
    kubectl_shared(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(  # the Checkpoint whose status the operator writes
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "Checkpoint",
                "metadata": {"name": "c1", "namespace": "team"},
                "spec": {"release": "gym"},
            }
        ),
    )
    with cluster.client(token=token) as operator:
        assert operator.get(f"{base}/checkpoints").status_code == 200
        assert operator.get(f"{base}/restores", params={"watch": "true", "timeoutSeconds": "0"}).status_code == 200
        assert operator.get("/api/v1/namespaces/team/pods").status_code == 200
        assert (
            operator.patch(
                f"{base}/checkpoints/c1/status", headers=merge, content='{"status": {"phase": "Preparing"}}'
            ).status_code
            == 200
        )
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": "c1."},
            "involvedObject": {"kind": "Checkpoint", "name": "c1", "namespace": "team"},
            "reason": "Preparing",
            "message": "preparing",
            "type": "Normal",
        }
        assert operator.post("/api/v1/namespaces/team/events", json=event).status_code == 201
        # DELETE of a Checkpoint is granted: the operator deletes one whose spec.ttl ran out; creating Checkpoints and
        # Restores too (a schedule's runs, a termination checkpoint, the automatic restore)
        for method, path in (
            ("DELETE", f"{base}/restores/r1"),
            ("POST", f"{base}/checkpointschedules"),
            ("DELETE", f"{base}/checkpointschedules/s1"),
            ("GET", "/api/v1/namespaces"),
            ("GET", "/api/v1/namespaces/default/pods"),
            ("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"),
            ("DELETE", "/api/v1/namespaces/team/pods/x"),
            ("GET", "/api/v1/namespaces/team/configmaps"),
        ):
            response = operator.request(method, path, json={} if method == "POST" else None)
            assert response.status_code == 403, (method, path, response.text)
