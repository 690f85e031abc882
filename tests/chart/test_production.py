"""What a production install needs, read off the rendered chart: a store reachable only through S3, network
policies, identity, disruption budgets, termination checkpoints, checksums, drains, portability, rollouts."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from tests.chart.test_render import VARIANTS, by_kind, env_of

pytestmark = pytest.mark.k8s

helm = pytest.importorskip("helm_python")

ROOT = Path(__file__).resolve().parents[2]
PARTICIPANTS = {"policy-model", "workplace-assistant", "simple-agent", "collection"}


def pods(docs: list[dict[str, Any]], hooks: bool = True) -> dict[str, dict[str, Any]]:
    """Every pod template by workload name (StatefulSets, Deployments, Jobs; without hooks=False the hook Jobs)."""
    return {
        doc["metadata"]["name"]: doc["spec"]["template"]
        for doc in docs
        if doc["kind"] in ("StatefulSet", "Deployment", "Job")
        and (hooks or "helm.sh/hook" not in doc["metadata"].get("annotations", {}))
    }


def refused(helm_chart: Any, values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmError) as caught:
        helm_chart.render(values, name="demo", namespace="prod")
    return str(caught.value)


# --- the embedded store -------------------------------------------------------------------------------


def test_seaweedfs_listens_on_loopback_only_behind_a_forwarder(render: Any) -> None:
    store = by_kind(render(), "StatefulSet")["demo-gym-checkpoint-s3"]
    weed, forwarder = store["spec"]["template"]["spec"]["containers"]
    args = weed["args"]
    assert "-ip=127.0.0.1" in args and "-ip.bind=127.0.0.1" in args
    assert not [a for a in args if "0.0.0.0" in a or a.startswith(("-s3.ip.bind", "-master.ip", "-filer.ip"))]
    assert "-s3.port=8334" in args and "-s3.port.iceberg=0" in args and "-s3.port.lance=0" in args
    assert forwarder["command"] == [
        "gymckpt",
        "forward",
        "--listen",
        "0.0.0.0:8333",
        "--to",
        "127.0.0.1:8334",
        "--create-bucket",
        "gym-checkpoints",
    ]
    assert forwarder["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "s3"}
    assert store["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 60


@pytest.mark.parametrize(("variant", "volumes", "size_mb"), [("defaults", 18, 512), ("big-embedded-store", 921, 1024)])
def test_store_capacity_follows_the_volume_size(render: Any, variant: str, volumes: int, size_mb: int) -> None:
    store = by_kind(render(VARIANTS[variant]), "StatefulSet")["demo-gym-checkpoint-s3"]
    args = store["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"-volume.max={volumes}" in args and f"-master.volumeSizeLimitMB={size_mb}" in args
    claim = store["spec"]["volumeClaimTemplates"][0]["spec"]
    size = claim["resources"]["requests"]["storage"]
    mib = int(size[:-2]) * {"Mi": 1, "Gi": 1024, "Ti": 1024**2}[size[-2:]]
    assert volumes * size_mb <= 0.9 * mib < (volumes + 1) * size_mb
    if variant == "big-embedded-store":
        assert claim["storageClassName"] == "standard-rwo"


def test_store_has_a_headless_governing_service(render: Any) -> None:
    docs = render()
    store = by_kind(docs, "StatefulSet")["demo-gym-checkpoint-s3"]
    headless = by_kind(docs, "Service")[store["spec"]["serviceName"]]
    assert headless["metadata"]["name"] == "demo-gym-checkpoint-s3-headless" and headless["spec"]["clusterIP"] == "None"
    assert by_kind(docs, "Service")["demo-gym-checkpoint-s3"]["spec"].get("clusterIP") != "None"


def test_a_store_too_small_for_its_volumes_is_refused(helm_chart: Any) -> None:
    message = refused(helm_chart, {"storage": {"embedded": {"persistence": {"size": "2Gi"}}}})
    assert "holds only 3 SeaweedFS volumes of 512 MB" in message


def test_in_cluster_keys_are_never_sent_to_an_external_endpoint(helm_chart: Any) -> None:
    message = refused(helm_chart, {"storage": {"s3": {"endpoint": "https://s3.example.com"}}})
    assert (
        "would send the in-cluster store's keys to that endpoint" in message
        and "storage.embedded.enabled=false" in message
    )


# --- network policy -------------------------------------------------------------------------------------


def test_network_policies_fence_control_ports_to_the_operator(render: Any) -> None:
    docs = render(VARIANTS["network-policy-extra-peers"])
    policies = by_kind(docs, "NetworkPolicy")
    release = {"app.kubernetes.io/name": "gym-checkpoint", "app.kubernetes.io/instance": "demo"}
    servers = policies["demo-gym-checkpoint-servers"]["spec"]
    assert servers["podSelector"]["matchLabels"] == {**release, "gym-checkpoint.dev/workload": "server"}
    data, control = servers["ingress"]
    assert data["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert data["from"] == [
        {"podSelector": {"matchLabels": release}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
    ]
    assert control == {
        "from": [{"podSelector": {"matchLabels": {**release, "app.kubernetes.io/component": "operator"}}}],
        "ports": [{"port": "control", "protocol": "TCP"}],
    }
    store = policies["demo-gym-checkpoint-object-store"]["spec"]
    assert store["podSelector"]["matchLabels"] == {**release, "app.kubernetes.io/component": "object-store"}
    assert store["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": release}}, {"podSelector": {"matchLabels": {"app": "backup"}}}],
            "ports": [{"port": "s3", "protocol": "TCP"}],
        }
    ]
    # every server pod is selected, and names both ports the policy refers to; the operator's pod matches
    for name, pod in pods(docs).items():
        labels = pod["metadata"]["labels"]
        if labels.get("gym-checkpoint.dev/workload") == "server":
            assert {p["name"] for p in pod["spec"]["containers"][0]["ports"]} == {"http", "control"}, name
    assert (
        by_kind(docs, "Deployment")["demo-gym-checkpoint-operator"]["spec"]["template"]["metadata"]["labels"][
            "app.kubernetes.io/component"
        ]
        == "operator"
    )
    assert not by_kind(render(VARIANTS["no-network-policy-no-pdb"]), "NetworkPolicy")


# --- identity --------------------------------------------------------------------------------------------


def test_servers_run_as_their_own_service_account(render: Any) -> None:
    """The servers' own identity, with no storage access of its own: a cloud identity for the store (IRSA, Workload
    Identity) belongs to the operator's ServiceAccount, whose gateway signs every server's request."""
    docs = render(VARIANTS["aws-irsa"])
    account = by_kind(docs, "ServiceAccount")["demo-gym-checkpoint-server"]
    assert "annotations" not in account["metadata"]
    assert account["automountServiceAccountToken"] is False
    operator_account = by_kind(docs, "ServiceAccount")["demo-gym-checkpoint-operator"]
    assert operator_account["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/gym"
    }
    assert "demo-gym-checkpoint-s3" not in by_kind(docs, "Secret")  # no static keys at all
    (location,) = by_kind(docs, "CheckpointStorageLocation").values()
    assert "credential" not in location["spec"] and location["spec"]["region"] == "us-west-2"  # the operator's role
    for name, pod in pods(docs, hooks=False).items():
        if name == "demo-gym-checkpoint-operator":
            continue
        assert pod["spec"]["serviceAccountName"] == "demo-gym-checkpoint-server"
        env = env_of(pod["spec"]["containers"][0])
        assert not [k for k in env if k.startswith("AWS_")]
    gke = render(VARIANTS["gke-workload-identity"])
    assert by_kind(gke, "ServiceAccount")["demo-gym-checkpoint-operator"]["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "gym@p.iam.gserviceaccount.com"
    }
    (location,) = by_kind(gke, "CheckpointStorageLocation").values()
    assert location["spec"]["endpoint"] == "https://storage.googleapis.com"
    assert all(
        pod["spec"]["serviceAccountName"] == "gym-ksa"
        for name, pod in pods(gke, hooks=False).items()
        if name != "demo-gym-checkpoint-operator"
    )


# --- disruption, terminations, checksums, drains ------------------------------------------------------------------


def test_a_disruption_budget_per_participant(render: Any) -> None:
    """The default lets drains and the autoscaler proceed one pod at a time (a disruption is recoverable from the
    latest checkpoint); 0 (blocking every eviction) and percentages are there for who wants them."""
    budgets = {n: b for n, b in by_kind(render(), "PodDisruptionBudget").items() if not n.endswith("-operator")}
    assert set(budgets) == {f"demo-gym-checkpoint-{name}" for name in PARTICIPANTS}
    for value in (0, "50%"):
        custom = by_kind(
            render({"serverDefaults": {"podDisruptionBudget": {"maxUnavailable": value}}}), "PodDisruptionBudget"
        )
        custom.pop("demo-gym-checkpoint-operator")
        assert {b["spec"]["maxUnavailable"] for b in custom.values()} == {value}
    for name, budget in budgets.items():
        assert budget["spec"]["maxUnavailable"] == 1 and budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        assert budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == name.removeprefix(
            "demo-gym-checkpoint-"
        )
    assert set(by_kind(render(VARIANTS["no-network-policy-no-pdb"]), "PodDisruptionBudget")) == {
        "demo-gym-checkpoint-operator"  # (the operator's own: its replicas, not a participant's)
    }


def test_server_pods_hold_for_the_termination_checkpoint_and_the_operator_takes_it(render: Any) -> None:
    """termination: every server pod's grace period, the servers' hold (the grace less the margin, through
    GYMCKPT__CHECKPOINT__TERMINATION_GRACE_S, non-participants too), and the operator's settings; no hook takes a
    checkpoint any more (a helm upgrade is a termination like any other) and nothing rolls every pod on upgrade."""

    def env(container: dict[str, Any]) -> dict[str, str]:
        return {item["name"]: item["value"] for item in container.get("env") or [] if "value" in item}

    for values, grace, hold, margin in (({}, 60, "50", "10"), (VARIANTS["termination-spot-nodes"], 120, "100", "20")):
        docs = render(values)
        servers = {
            name: pod
            for name, pod in pods(docs).items()
            if pod["metadata"]["labels"].get("gym-checkpoint.dev/workload") == "server"
        }
        assert len(servers) == 5
        for pod in servers.values():
            assert pod["spec"]["terminationGracePeriodSeconds"] == grace
            assert env(pod["spec"]["containers"][0])["GYMCKPT__CHECKPOINT__TERMINATION_GRACE_S"] == hold
            assert "gym-checkpoint.dev/release-revision" not in pod["metadata"]["annotations"]
        operator = env(pods(docs)["demo-gym-checkpoint-operator"]["spec"]["containers"][0])
        assert operator["GYMCKPT_TERMINATION_CHECKPOINT"] == "enabled" and operator["GYMCKPT_AUTO_RESTORE"] == "enabled"
        assert operator["GYMCKPT_TERMINATION_MARGIN_SECONDS"] == margin
        assert set(by_kind(docs, "Job")) == {  # the secrets, the CRDs and the uninstall hooks; none checkpoints
            "demo-gym-checkpoint-secrets-create",
            "demo-gym-checkpoint-secrets-delete",
            "demo-gym-checkpoint-crds",
            "demo-gym-checkpoint-uninstall",
        }
    off = render(VARIANTS["no-termination-checkpoint-no-auto-restore"])
    for name, pod in pods(off).items():
        if pod["metadata"]["labels"].get("gym-checkpoint.dev/workload") == "server":
            assert pod["spec"]["terminationGracePeriodSeconds"] == 30
            assert "GYMCKPT__CHECKPOINT__TERMINATION_GRACE_S" not in env(pod["spec"]["containers"][0]), name
    operator = env(pods(off)["demo-gym-checkpoint-operator"]["spec"]["containers"][0])
    assert operator["GYMCKPT_TERMINATION_CHECKPOINT"] == "disabled" and operator["GYMCKPT_AUTO_RESTORE"] == "disabled"


def test_pods_roll_when_a_secret_value_changes(render: Any) -> None:
    def checksums(values: dict[str, Any]) -> set[str]:
        return {
            pod["metadata"]["annotations"]["checksum/secrets"] for pod in pods(render(values), hooks=False).values()
        }

    fixed = {
        "controlToken": {"value": "a" * 32},
        "sessionSecret": {"value": "b" * 32},
        "storage": {"s3": {"accessKeyId": "AKIA0000", "secretAccessKey": "secret0000"}},
    }
    (one,) = checksums(fixed)  # one checksum shared by every workload
    assert checksums(fixed) == {one}
    assert checksums({**fixed, "controlToken": {"value": "c" * 32}}) != {one}
    assert checksums({**fixed, "storage": {"s3": {"accessKeyId": "AKIA0001", "secretAccessKey": "secret0000"}}}) != {
        one
    }
    # it is the digest of the very values the rendered Secrets hold
    docs = render(fixed)
    secrets = by_kind(docs, "Secret")
    parts = [
        secrets["demo-gym-checkpoint-control"]["data"]["token"],
        secrets["demo-gym-checkpoint-session"]["data"]["secret"],
        secrets["demo-gym-checkpoint-s3"]["data"]["AWS_ACCESS_KEY_ID"],
        secrets["demo-gym-checkpoint-s3"]["data"]["AWS_SECRET_ACCESS_KEY"],
    ]
    assert base64.b64decode(parts[0]).decode() == "a" * 32
    expected = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    assert {pod["metadata"]["annotations"]["checksum/secrets"] for pod in pods(docs, hooks=False).values()} == {
        expected
    }
    # generated values never change and existing Secrets are not read: neither moves the checksum
    assert checksums({}) == checksums({"controlToken": {"existingSecret": "ops"}}) == {hashlib.sha256(b"").hexdigest()}


def test_a_long_drain_without_termination_checkpoints_and_updates_that_wait(render: Any) -> None:
    docs = render(VARIANTS["on-delete-updates-long-drain"])
    for sts in by_kind(docs, "StatefulSet").values():
        if sts["metadata"]["name"] == "demo-gym-checkpoint-s3":
            continue
        pod = sts["spec"]["template"]
        assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
        assert pod["spec"]["terminationGracePeriodSeconds"] == 315
        command = pod["spec"]["containers"][0]["command"]
        assert command[command.index("--drain-timeout") + 1] == "300"
        assert command[command.index("--control-port") + 1] == "9100"
        assert pod["metadata"]["annotations"]["gym-checkpoint.dev/control-port"] == "9100"


# --- portability -------------------------------------------------------------------------------------------


def test_uids_can_be_left_to_the_platform(render: Any) -> None:
    docs = render(VARIANTS["openshift-assigned-uids"])
    for name, pod in pods(docs).items():
        context = pod["spec"]["securityContext"]
        assert context["runAsNonRoot"] is True and not {"runAsUser", "runAsGroup", "fsGroup"} & set(context), name
        for container in pod["spec"]["containers"]:
            assert not {"runAsUser", "runAsGroup"} & set(container["securityContext"]), name


def test_scheduling_reaches_servers_operator_and_store(render: Any) -> None:
    docs = render(VARIANTS["scheduling-everywhere"])
    for name, pod in pods(docs).items():
        spec = pod["spec"]
        assert spec["priorityClassName"] == "rl-high" and spec["nodeSelector"] == {"pool": "rollouts"}, name
        assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert "nodeAffinity" in spec["affinity"]
        if pod["metadata"]["labels"].get("gym-checkpoint.dev/workload") == "server":
            assert spec["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"


def test_pod_metadata_env_and_volumes(render: Any) -> None:
    docs = render(VARIANTS["pod-metadata-env-volumes"])
    for name, pod in pods(docs, hooks=False).items():
        assert pod["metadata"]["labels"]["team"] == "rl", name
        if pod["metadata"]["labels"].get("gym-checkpoint.dev/workload") != "server":
            continue
        assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        container = pod["spec"]["containers"][0]
        assert env_of(container)["HF_HOME"] == {"name": "HF_HOME", "value": "/cache"}
        assert {"name": "cache", "mountPath": "/cache"} in container["volumeMounts"]
        assert {"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}} in pod["spec"]["volumes"]
    store = pods(docs)["demo-gym-checkpoint-s3"]
    assert store["metadata"]["annotations"]["backup"] == "yes"


def test_image_digests_and_pull_secrets_everywhere(render: Any) -> None:
    docs = render(VARIANTS["image-digest-pull-secrets"])
    for name, pod in pods(docs).items():
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}], name
        for container in pod["spec"]["containers"]:
            image = container["image"]
            assert image in (
                "registry.example.com/ml/gym-checkpoint@sha256:" + "a" * 64,
                "chrislusf/seaweedfs@sha256:" + "b" * 64,
            ), image


@pytest.mark.parametrize(
    ("variant", "flag"), [("operator-debug-plain-logs", "--verbose"), ("operator-quiet", "--quiet")]
)
def test_operator_log_level_and_format_reach_kopf(render: Any, variant: str, flag: str) -> None:
    command = by_kind(render(VARIANTS[variant]), "Deployment")["demo-gym-checkpoint-operator"]["spec"]["template"][
        "spec"
    ]["containers"][0]["command"]
    assert flag in command
    assert command[command.index("--log-format") + 1] == ("plain" if "plain" in variant else "json")


# --- rollouts on the cluster --------------------------------------------------------------------------------


def test_the_collection_server_keeps_tasks_and_results_on_a_volume(render: Any) -> None:
    docs = render()
    sts = by_kind(docs, "StatefulSet")["demo-gym-checkpoint-collection"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][2] == "collection"
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "5Gi"
    config = by_kind(docs, "ConfigMap")["demo-gym-checkpoint-collection-config"]["data"]["config.yaml"]
    assert (
        "data_dir: /data" in config and "simple-agent: http://demo-gym-checkpoint-simple-agent.prod.svc:8000" in config
    )


def test_rollouts_custom_and_disabled(render: Any) -> None:
    docs = render(VARIANTS["rollouts-custom"])
    sts = by_kind(docs, "StatefulSet")["demo-gym-checkpoint-collector"]
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "fast" and claim["resources"]["requests"]["storage"] == "50Gi"
    assert sts["spec"]["template"]["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}}
    config = by_kind(docs, "ConfigMap")["demo-gym-checkpoint-collector-config"]["data"]["config.yaml"]
    assert "workplace: http://demo-gym-checkpoint-simple-agent.prod.svc:8000" in config
    assert "default_agent: workplace" in config and "request_timeout_s: 600" in config
    assert by_kind(docs, "Service")["demo-gym-checkpoint-collector"]["spec"]["ports"][0]["port"] == 9000
    off = render(VARIANTS["rollouts-disabled"])
    assert not [n for n in by_kind(off, "StatefulSet") if "collection" in n]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"servers": [{"name": "env", "server": "blackjack", "role": "environment"}]},
            "rollouts.enabled needs an agent",
        ),
        ({"rollouts": {"agents": {"a": "nope"}}}, 'rollouts.agents.a names server "nope"'),
        ({"rollouts": {"name": "simple-agent"}}, 'the name "simple-agent" is used twice'),
        (
            {"servers": [{"name": "a", "server": "counter", "role": "resources", "port": 8001}]},
            "port and controlPort are both 8001",
        ),
        (
            {"termination": {"gracePeriodSeconds": 15, "marginSeconds": 10}},
            "termination.gracePeriodSeconds (15) leaves no time for a termination checkpoint",
        ),
        (
            {"serverDefaults": {"drainSeconds": 10}},
            "drainSeconds (10) must be shorter than termination.marginSeconds (10)",
        ),
        (
            {"termination": {"checkpoint": False, "gracePeriodSeconds": 30}, "serverDefaults": {"drainSeconds": 30}},
            "drainSeconds (30) must be shorter than termination.gracePeriodSeconds (30)",
        ),
        ({"storage": {"embedded": {"enabled": False}}}, "no storage location: every Checkpoint would fail"),
    ],
)
def test_inconsistent_values_are_refused_with_the_fix(helm_chart: Any, values: dict[str, Any], message: str) -> None:
    assert message in refused(helm_chart, values)


# --- GitOps, shared clusters -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["defaults", "explicit-secrets", "existing-secrets", "termination-spot-nodes"])
def test_two_renders_are_identical(helm_chart: Any, variant: str) -> None:
    """`helm template` twice (Argo CD, Flux) gives the same manifests, Secrets and checksums included: nothing random
    is rendered (generated values come from the secrets hook) and no template reads the cluster."""
    first = helm_chart.render(VARIANTS[variant], name="demo", namespace="prod")
    second = helm_chart.render(VARIANTS[variant], name="demo", namespace="prod")
    assert first == second
    templates = (ROOT / "charts" / "gym-checkpoint" / "templates").glob("*")
    assert not [t.name for t in templates if re.search(r"\blookup\s+\"", t.read_text())]


def test_egress_policies_for_default_deny_clusters(render: Any) -> None:
    release = {"app.kubernetes.io/name": "gym-checkpoint", "app.kubernetes.io/instance": "demo"}
    dns = {
        "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
        "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
    }
    off = by_kind(render(), "NetworkPolicy")
    assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in off.values())  # egress untouched by default
    operator = off["demo-gym-checkpoint-operator"]["spec"]
    assert operator["podSelector"]["matchLabels"] == {**release, "app.kubernetes.io/component": "operator"}
    # only the release's servers connect to the operator: its storage gateway
    assert operator["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": {**release, "gym-checkpoint.dev/workload": "server"}}}],
            "ports": [{"port": "gateway", "protocol": "TCP"}],
        }
    ]

    policies = by_kind(render(VARIANTS["network-policy-egress"]), "NetworkPolicy")
    api = {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 443, "protocol": "TCP"}]}
    own = {"to": [{"podSelector": {"matchLabels": release}}]}
    servers = policies["demo-gym-checkpoint-servers"]["spec"]
    assert servers["policyTypes"] == ["Ingress", "Egress"]
    assert servers["egress"] == [own, dns, {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 8000}]}]
    assert policies["demo-gym-checkpoint-operator"]["spec"]["egress"] == [own, dns, api]  # embedded store: no S3 rule
    assert policies["demo-gym-checkpoint-object-store"]["spec"]["egress"] == []
    hooks = policies["demo-gym-checkpoint-hooks"]
    assert hooks["metadata"]["annotations"]["helm.sh/hook"].split(",")[:2] == ["pre-install", "pre-upgrade"]
    assert hooks["spec"]["podSelector"]["matchExpressions"] == [
        {
            "key": "app.kubernetes.io/component",
            "operator": "In",
            "values": ["secrets-hook", "uninstall-hook", "crds-hook"],
        }
    ]
    assert hooks["spec"]["egress"] == [dns, api] and hooks["spec"]["ingress"] == []
    # every hook Job's pod is one the hooks policy selects
    for job in by_kind(render(VARIANTS["network-policy-egress"]), "Job").values():
        assert job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] in (
            "secrets-hook",
            "uninstall-hook",
            "crds-hook",
        )

    external = by_kind(render(VARIANTS["network-policy-egress-external-store"]), "NetworkPolicy")
    s3 = {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 9000, "protocol": "TCP"}]}
    any_dns = {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    assert external["demo-gym-checkpoint-servers"]["spec"]["egress"] == [own, any_dns, s3]
    assert s3 in external["demo-gym-checkpoint-operator"]["spec"]["egress"]
    # the tokens are still generated (only the S3 keys exist already): the secrets hook
    assert external["demo-gym-checkpoint-hooks"]["spec"]["podSelector"]["matchExpressions"][0]["values"] == [
        "secrets-hook",
        "uninstall-hook",
        "crds-hook",
    ]


def test_namespace_users_get_checkpoints_through_their_default_roles(render: Any) -> None:
    roles = by_kind(render(), "ClusterRole")
    view, edit = roles["prod-demo-gym-checkpoint-view"], roles["prod-demo-gym-checkpoint-edit"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k in view["metadata"]["labels"] if k.startswith(aggregate)} == {aggregate + "view"}
    assert {k for k in edit["metadata"]["labels"] if k.startswith(aggregate)} == {
        aggregate + "edit",
        aggregate + "admin",
    }
    for role, verbs in (
        (view, {"get", "list", "watch"}),
        (edit, {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}),
    ):
        (rule,) = role["rules"]
        assert rule["resources"] == ["checkpoints", "restores", "checkpointschedules"] and set(rule["verbs"]) == verbs
    assert not by_kind(render(VARIANTS["namespace-scoped-deployer"]), "ClusterRole")
    # two releases (or namespaces) never claim the same ClusterRole
    assert not set(roles) & set(by_kind(render(name="other"), "ClusterRole"))
    assert not set(roles) & set(by_kind(render(namespace="staging"), "ClusterRole"))
