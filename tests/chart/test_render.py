"""The chart rendered by real Helm: every manifest valid for Kubernetes 1.33, labels, security, wiring."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from tests.chart import schemas

pytestmark = pytest.mark.k8s

kubernetes_validate = pytest.importorskip("kubernetes_validate")

CHART = Path(__file__).resolve().parents[2] / "charts" / "gym-checkpoint"
K8S_VERSION = "1.33.0"
STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
)
EXTERNAL_S3 = {
    "storage": {
        "location": "s3://training-ckpts/team-a",
        "embedded": {"enabled": False},
        "s3": {"endpoint": "https://s3.example.com", "region": "eu-west-1", "existingSecret": "team-a-s3"},
    }
}
CUSTOM_SERVERS = {
    "servers": [
        {"name": "blackjack", "server": "blackjack", "role": "environment", "port": 9001},
        {
            "name": "gym-agent",
            "server": "gymnasium_agent",
            "role": "agent",
            "port": 9002,
            "config": {
                "environment_url": '{{ include "gym-checkpoint.serverUrl" (dict "root" $ "name" "blackjack") }}'
            },
            "env": [{"name": "EXTRA", "value": "yes"}],
            "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}},
        },
    ]
}
SCHEDULING = {
    "nodeSelector": {"pool": "rollouts"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
            }
        }
    },
    "priorityClassName": "rl-high",
}
# The chart check of CI: every variation renders, validates strictly against Kubernetes 1.33 and lints clean.
VARIANTS = {
    "defaults": {},
    "external-s3-existing-secret": EXTERNAL_S3,
    "custom-servers": CUSTOM_SERVERS,
    "explicit-secrets": {
        "controlToken": {"value": "a" * 32},
        "sessionSecret": {"value": "b" * 32},
        "storage": {
            "embedded": {"enabled": False},
            "location": "file:///var/lib/ckpt",
            "s3": {"accessKeyId": "AKIA0000", "secretAccessKey": "secret0000"},
            "gateway": {"existingSecret": "ops-gateway"},
        },
    },
    "existing-secrets": {
        "controlToken": {"existingSecret": "ops-token", "existingSecretKey": "tok"},
        "sessionSecret": {"existingSecret": "ops-session"},
    },
    "cluster-scanning-no-operator-sa": {
        "operator": {"rbac": {"clusterScanning": True}, "serviceAccount": {"create": False, "name": "ops"}}
    },
    "operator-disabled": {"operator": {"enabled": False}},
    "operator-debug-plain-logs": {"operator": {"logLevel": "debug", "logFormat": "plain"}},
    "operator-quiet": {"operator": {"logLevel": "warning"}},
    "openshift-assigned-uids": {"security": {"runAsUser": None, "runAsGroup": None, "fsGroup": None}},
    "aws-irsa": {
        "operator": {
            "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/gym"}}
        },
        "storage": {"location": "s3://team-ckpts/rl", "embedded": {"enabled": False}, "s3": {"region": "us-west-2"}},
    },
    "gke-workload-identity": {
        "serviceAccount": {"name": "gym-ksa"},
        "operator": {
            "serviceAccount": {"annotations": {"iam.gke.io/gcp-service-account": "gym@p.iam.gserviceaccount.com"}}
        },
        "storage": {
            "location": "s3://gcs-bucket/rl",
            "embedded": {"enabled": False},
            "s3": {"endpoint": "https://storage.googleapis.com", "region": "auto"},
        },
    },
    "termination-spot-nodes": {"termination": {"gracePeriodSeconds": 120, "marginSeconds": 20, "leaseSeconds": 10}},
    "no-termination-checkpoint-no-auto-restore": {
        "termination": {"checkpoint": False, "gracePeriodSeconds": 30},
        "autoRestore": {"enabled": False},
    },
    "network-policy-egress": {
        "networkPolicy": {
            "egress": {
                "enabled": True,
                "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [443]},
                "extraEgress": [{"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 8000}]}],
            }
        },
    },
    "network-policy-egress-external-store": {
        "networkPolicy": {"egress": {"enabled": True, "dns": [], "storage": {"to": [], "ports": [443, 9000]}}},
        **EXTERNAL_S3,
    },
    "namespace-scoped-deployer": {"rbac": {"aggregateToDefaultRoles": False}, "crds": {"upgrade": False}},
    "operator-one-replica-no-hooks": {"operator": {"replicas": 1, "uninstallHook": {"enabled": False}}},
    "operator-three-replicas-preferred-spread": {"operator": {"replicas": 3, "antiAffinity": "preferred"}},
    "monitoring-and-locations": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "prometheusRule": {"enabled": True, "checkpointIntervalSeconds": 1800, "missedIntervals": 4},
            "dashboard": {"enabled": True},
        },
        "storage": {
            "locations": {
                "archive": {"url": "s3://old-cluster/gym", "existingSecret": "archive-s3", "accessMode": "ReadOnly"},
                "scratch": {"url": "file:///mnt/shared/ckpt"},
            },
            "credentialSecrets": ["hand-made-s3"],
            "gateway": {"existingSecret": "ops-gateway"},
            "validationFrequency": "5m",
        },
        "networkPolicy": {"extraIngress": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
    },
    "generated-secrets-kept-on-uninstall": {"generatedSecrets": {"deleteOnUninstall": False}},
    "pdb-blocking-or-percent": {"serverDefaults": {"podDisruptionBudget": {"maxUnavailable": "25%"}}},
    "no-network-policy-no-pdb": {
        "networkPolicy": {"enabled": False},
        "serverDefaults": {"podDisruptionBudget": {"enabled": False}},
    },
    "network-policy-extra-peers": {
        "networkPolicy": {
            "extraIngress": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "extraStoreIngress": [{"podSelector": {"matchLabels": {"app": "backup"}}}],
        }
    },
    "scheduling-everywhere": {
        "serverDefaults": {
            **SCHEDULING,
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
            ],
        },
        "operator": SCHEDULING,
        "storage": {"embedded": SCHEDULING},
    },
    "pod-metadata-env-volumes": {
        "serverDefaults": {
            "podAnnotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"},
            "podLabels": {"team": "rl"},
            "extraEnv": [{"name": "HF_HOME", "value": "/cache"}],
            "extraVolumes": [{"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}}],
            "extraVolumeMounts": [{"name": "cache", "mountPath": "/cache"}],
        },
        "operator": {"podAnnotations": {"a": "b"}, "podLabels": {"team": "rl"}},
        "storage": {"embedded": {"podAnnotations": {"backup": "yes"}, "podLabels": {"team": "rl"}}},
    },
    "image-digest-pull-secrets": {
        "image": {"repository": "registry.example.com/ml/gym-checkpoint", "digest": "sha256:" + "a" * 64},
        "imagePullSecrets": [{"name": "regcred"}],
        "storage": {"embedded": {"image": {"digest": "sha256:" + "b" * 64}}},
    },
    "rollouts-disabled": {"rollouts": {"enabled": False}},
    "rollouts-custom": {
        "rollouts": {
            "name": "collector",
            "port": 9000,
            "agents": {"workplace": "simple-agent"},
            "defaultAgent": "workplace",
            "config": {"request_timeout_s": 600},
            "persistence": {"size": "50Gi", "storageClassName": "fast"},
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        }
    },
    "big-embedded-store": {
        "storage": {
            "embedded": {"volumeSizeLimitMB": 1024, "persistence": {"size": "1Ti", "storageClassName": "standard-rwo"}}
        }
    },
    "on-delete-updates-long-drain": {
        "serverDefaults": {"updateStrategy": "OnDelete", "drainSeconds": 300, "controlPort": 9100},
        "termination": {"checkpoint": False, "gracePeriodSeconds": 315},
    },
    "name-overrides": {"fullnameOverride": "rl"},
    "replicas": {
        "servers": [
            {"name": "worker", "server": "inference_worker", "participant": False, "replicas": 4},
            {
                "name": "model",
                "server": "policy_model",
                "role": "model",
                "replicas": 2,
                "config": {
                    "upstream": {
                        "base_url": '{{ include "gym-checkpoint.serverUrl" (dict "root" $ "name" "worker") }}/v1'
                    }
                },
            },
            {
                "name": "agent",
                "server": "simple_agent",
                "role": "agent",
                "replicas": 3,
                "config": {"model_url": '{{ include "gym-checkpoint.serverUrl" (dict "root" $ "name" "model") }}'},
            },
        ]
    },
}


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_manifest_validates_strictly_against_kubernetes(render: Any, variant: str) -> None:
    """Kubernetes' kinds against Kubernetes 1.33 (kubernetes-validate --strict), the chart's custom resources
    against their CRDs, the monitoring kinds against the fields this chart sets (tests/chart/schemas.py)."""
    docs = render(VARIANTS[variant])
    assert docs
    for doc in docs:
        schemas.validate(doc)
        labels = doc["metadata"]["labels"]
        assert all(key in labels for key in STANDARD_LABELS), (doc["kind"], doc["metadata"]["name"])
        assert labels["app.kubernetes.io/instance"] == "demo"


def test_a_schema_violation_is_caught_by_the_validator(render: Any) -> None:
    """Guards the test above against validating nothing: a bogus field must fail, in the validators made once per
    kind (tests/chart/schemas.py) as in kubernetes-validate's own call."""
    sts = by_kind(render(), "StatefulSet")["demo-gym-checkpoint-policy-model"]
    schemas.validate(sts)
    kubernetes_validate.validate(sts, K8S_VERSION, strict=True)
    sts["spec"]["template"]["spec"]["containers"][0]["bogusField"] = 1
    with pytest.raises(jsonschema.ValidationError, match="bogusField"):
        schemas.validate(sts)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lint_strict_is_clean(variant: str) -> None:
    helm = pytest.importorskip("helm_python")
    result = helm.lint(str(CHART), VARIANTS[variant], strict=True, kube_version="v1.33.0")
    assert result["messages"] == [] and result["errors"] == []


def test_default_stack_one_statefulset_service_and_config_per_server(render: Any) -> None:
    docs = render()
    sets, services, maps = by_kind(docs, "StatefulSet"), by_kind(docs, "Service"), by_kind(docs, "ConfigMap")
    expected = {
        "inference-worker": ("inference_worker", None),
        "policy-model": ("policy_model", "model"),
        "workplace-assistant": ("workplace_assistant", "resources"),
        "simple-agent": ("simple_agent", "agent"),
        "collection": ("collection", "controller"),
    }
    assert set(sets) == {f"demo-gym-checkpoint-{name}" for name in expected} | {"demo-gym-checkpoint-s3"}
    for name, (server, role) in expected.items():
        full = f"demo-gym-checkpoint-{name}"
        sts = sets[full]
        pod = sts["spec"]["template"]
        assert sts["spec"]["replicas"] == 1 and sts["spec"]["serviceName"] == f"{full}-headless"
        labels = pod["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "gym-checkpoint" and labels["app.kubernetes.io/instance"] == "demo"
        if role is None:  # the built-in backend is no checkpoint participant
            assert "gym-checkpoint.dev/role" not in labels and "gym-checkpoint.dev/participant" not in labels
        else:
            assert labels["gym-checkpoint.dev/role"] == role and labels["gym-checkpoint.dev/participant"] == name
        assert pod["metadata"]["annotations"]["gym-checkpoint.dev/control-port"] == "8001"
        container = pod["spec"]["containers"][0]
        assert container["command"] == [
            "gymckpt",
            "serve",
            server,
            "--config",
            "/etc/gymckpt/config.yaml",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--control-port",
            "8001",
            "--drain-timeout",
            "5",
        ]
        assert container["ports"] == [
            {"name": "http", "containerPort": 8000, "protocol": "TCP"},
            {"name": "control", "containerPort": 8001, "protocol": "TCP"},
        ]
        assert pod["spec"]["terminationGracePeriodSeconds"] == 60  # termination.gracePeriodSeconds
        assert container["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}
        assert container["resources"]["requests"] and container["resources"]["limits"]
        for service in (services[full], services[f"{full}-headless"]):
            assert service["spec"]["ports"][0]["targetPort"] == "http"
            assert labels.items() >= service["spec"]["selector"].items()
        assert services[f"{full}-headless"]["spec"]["clusterIP"] == "None"
        assert f"name: {name}" in maps[f"{full}-config"]["data"]["config.yaml"]
        assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_server_pods_are_locked_down(render: Any) -> None:
    docs = render()
    pods = [sts["spec"]["template"]["spec"] for sts in by_kind(docs, "StatefulSet").values()]
    pods += [dep["spec"]["template"]["spec"] for dep in by_kind(docs, "Deployment").values()]
    assert len(pods) == 7
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["runAsNonRoot"] is True
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert any(volume["name"] == "tmp" and "emptyDir" in volume for volume in pod["volumes"])


def test_servers_get_tokens_identity_and_the_gateway_never_a_storage_key(render: Any) -> None:
    docs = render()
    # nothing given: every value comes from the generated Secrets, which the secrets hook creates (none rendered)
    assert not by_kind(docs, "Secret")
    (create,) = [job for name, job in by_kind(docs, "Job").items() if name.endswith("-secrets-create")]
    pod = create["spec"]["template"]["spec"]
    made = {c["command"][3]: c["command"] for c in [*pod.get("initContainers", []), *pod["containers"]]}
    keys = {name: [command[i + 1] for i, arg in enumerate(command) if arg == "--key"] for name, command in made.items()}
    assert keys == {
        "demo-gym-checkpoint-generated": ["token=48", "secret=48"],
        "demo-gym-checkpoint-storage": ["gateway-key=48", "AWS_ACCESS_KEY_ID=20", "AWS_SECRET_ACCESS_KEY=40"],
    }
    # an older chart kept the store's keys in the servers' Secret: the hook moves them out
    storage = made["demo-gym-checkpoint-storage"]
    assert storage[storage.index("--move-from") + 1] == "demo-gym-checkpoint-generated"
    container = by_kind(docs, "StatefulSet")["demo-gym-checkpoint-policy-model"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = env_of(container)
    assert env["GYMCKPT_CONTROL_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "demo-gym-checkpoint-generated",
        "key": "token",
    }
    assert env["GYMCKPT_SESSION_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "demo-gym-checkpoint-generated",
        "key": "secret",
    }
    assert env["GYMCKPT_PARTICIPANT_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["GYMCKPT__STORAGE__GATEWAY_URL"]["value"] == "http://demo-gym-checkpoint-operator.prod.svc:8081"
    assert not [name for name in env if name.startswith("AWS_")]
    service = by_kind(docs, "Service")["demo-gym-checkpoint-operator"]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"gateway": 8081, "metrics": 8080}


def test_embedded_store_is_the_default_location(render: Any) -> None:
    docs = render()
    store = by_kind(docs, "StatefulSet")["demo-gym-checkpoint-s3"]
    container = store["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "chrislusf/seaweedfs:4.48" and container["args"][0] == "server"
    assert "-s3" in container["args"] and "ports" not in container  # SeaweedFS itself exposes no port
    forwarder = store["spec"]["template"]["spec"]["containers"][1]
    assert forwarder["ports"] == [{"name": "s3", "containerPort": 8333, "protocol": "TCP"}]
    assert store["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert env_of(container)["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "demo-gym-checkpoint-storage"
    assert by_kind(docs, "Service")["demo-gym-checkpoint-s3"]["spec"]["ports"][0]["port"] == 8333
    (location,) = by_kind(docs, "CheckpointStorageLocation").values()
    assert location["metadata"]["name"] == "demo-gym-checkpoint-default"
    assert location["metadata"]["labels"]["gym-checkpoint.dev/location"] == "default"
    assert location["spec"] == {
        "release": "demo",
        "provider": "s3",
        "bucket": "gym-checkpoints",
        "prefix": "demo",
        "endpoint": "http://demo-gym-checkpoint-s3.prod.svc:8333",
        "region": "us-east-1",
        "credential": {"name": "demo-gym-checkpoint-storage"},
        "accessMode": "ReadWrite",
        "validationFrequency": "1m",
    }
    operator = by_kind(docs, "Deployment")["demo-gym-checkpoint-operator"]["spec"]["template"]["spec"]["containers"][0]
    assert "GYMCKPT_STORAGE" not in env_of(operator)  # the location is the resource now
    assert env_of(operator)["GYMCKPT_GATEWAY_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "demo-gym-checkpoint-storage",
        "key": "gateway-key",
    }


def test_external_s3_with_an_existing_secret(render: Any) -> None:
    docs = render(EXTERNAL_S3)
    assert "demo-gym-checkpoint-s3" not in by_kind(docs, "StatefulSet")
    assert "demo-gym-checkpoint-s3" not in by_kind(docs, "Secret")
    for workload in [*by_kind(docs, "StatefulSet").values(), *by_kind(docs, "Deployment").values()]:
        env = env_of(workload["spec"]["template"]["spec"]["containers"][0])
        assert not [name for name in env if name.startswith("AWS_")], workload["metadata"]["name"]
    (location,) = by_kind(docs, "CheckpointStorageLocation").values()
    assert location["spec"] == {
        "release": "demo",
        "provider": "s3",
        "bucket": "training-ckpts",
        "prefix": "team-a",
        "endpoint": "https://s3.example.com",
        "region": "eu-west-1",
        "credential": {"name": "team-a-s3"},
        "accessMode": "ReadWrite",
        "validationFrequency": "1m",
    }
    role = by_kind(docs, "Role")["demo-gym-checkpoint-operator"]
    assert [r["resourceNames"] for r in role["rules"] if r["resources"] == ["secrets"]] == [["team-a-s3"]]


def test_no_workload_pod_holds_a_storage_key(render: Any) -> None:
    """Every rendered variant: no pod but the operator's and the embedded store's references a Secret that holds a
    storage location's keys or the gateway's signing key, by env, envFrom or volume; no such pod has an AWS_
    variable; and no Secret those pods reference (rendered, or made by the secrets hook) holds such a key."""
    for variant, values in VARIANTS.items():
        docs = render(values)
        fullname = values.get("fullnameOverride") or "demo-gym-checkpoint"
        locations = by_kind(docs, "CheckpointStorageLocation").values()
        key_secrets = {loc["spec"]["credential"]["name"] for loc in locations if loc["spec"].get("credential")}
        key_secrets |= {f"{fullname}-storage", f"{fullname}-s3"}
        key_secrets |= set(values.get("storage", {}).get("credentialSecrets", []))
        key_secrets |= {values.get("storage", {}).get("gateway", {}).get("existingSecret") or ""} - {""}
        made = {}
        for job in by_kind(docs, "Job").values():
            spec = job["spec"]["template"]["spec"]
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                if c["command"][:3] == ["gymckpt", "cluster", "secret"] and "--key" in c["command"]:
                    made[c["command"][3]] = [c["command"][i + 1] for i, a in enumerate(c["command"]) if a == "--key"]
        rendered = {name: set(secret.get("data", {})) for name, secret in by_kind(docs, "Secret").items()}
        pods = [
            (f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"])
            for doc in docs
            if doc["kind"] in ("StatefulSet", "Deployment", "Job")
            and doc["metadata"]["name"] not in (f"{fullname}-operator", f"{fullname}-s3")
        ]
        assert pods, variant
        for name, pod in pods:
            referenced = set()
            for c in [*pod.get("initContainers", []), *pod["containers"]]:
                assert not [e["name"] for e in c.get("env", []) if e["name"].startswith("AWS_")], (variant, name)
                referenced |= {
                    e["valueFrom"]["secretKeyRef"]["name"]
                    for e in c.get("env", [])
                    if "secretKeyRef" in e.get("valueFrom", {})
                }
                referenced |= {e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e}
            for volume in pod.get("volumes", []):
                if "secret" in volume:
                    referenced.add(volume["secret"]["secretName"])
                for source in volume.get("projected", {}).get("sources", []):
                    if "secret" in source:
                        referenced.add(source["secret"]["name"])
            assert not referenced & key_secrets, (variant, name, referenced & key_secrets)
            for secret in referenced:
                keys = rendered.get(secret, set()) | {k.split("=")[0] for k in made.get(secret, [])}
                assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "gateway-key"} & keys, (variant, name, secret)


def test_custom_servers_with_ports_env_resources_and_templated_config(render: Any) -> None:
    docs = render(CUSTOM_SERVERS)
    sets = by_kind(docs, "StatefulSet")
    assert set(sets) == {
        "demo-gym-checkpoint-blackjack",
        "demo-gym-checkpoint-gym-agent",
        "demo-gym-checkpoint-collection",
        "demo-gym-checkpoint-s3",
    }
    agent = sets["demo-gym-checkpoint-gym-agent"]["spec"]["template"]
    container = agent["spec"]["containers"][0]
    assert (
        container["command"][2] == "gymnasium_agent"
        and container["command"][container["command"].index("--port") + 1] == "9002"
    )
    assert agent["metadata"]["annotations"]["gym-checkpoint.dev/control-port"] == "8001"
    assert env_of(container)["EXTRA"]["value"] == "yes"
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "1Gi"}}
    config = by_kind(docs, "ConfigMap")["demo-gym-checkpoint-gym-agent-config"]["data"]["config.yaml"]
    assert "environment_url: http://demo-gym-checkpoint-blackjack.prod.svc:9001" in config
    assert (
        sets["demo-gym-checkpoint-collection"]["spec"]["template"]["metadata"]["labels"]["gym-checkpoint.dev/role"]
        == "controller"
    )
    collection = by_kind(docs, "ConfigMap")["demo-gym-checkpoint-collection-config"]["data"]["config.yaml"]
    assert "gym-agent: http://demo-gym-checkpoint-gym-agent.prod.svc:9002" in collection  # the one agent, by default
    assert "default_agent: gym-agent" in collection


def test_replicated_servers_are_addressed_by_ordinal_under_their_headless_service(render: Any) -> None:
    url = '{{ include "gym-checkpoint.serverUrl" (dict "root" $ "name" "%s") }}'
    docs = render(
        {
            "servers": [
                {"name": "worker", "server": "inference_worker", "participant": False, "replicas": 4},
                {
                    "name": "model",
                    "server": "policy_model",
                    "role": "model",
                    "replicas": 2,
                    "config": {"upstream": {"base_url": url % "worker" + "/v1"}},
                },
                {
                    "name": "agent",
                    "server": "simple_agent",
                    "role": "agent",
                    "replicas": 3,
                    "config": {"model_url": url % "model", "resources_url": url % "tools"},
                },
                {"name": "tools", "server": "workplace_assistant", "role": "resources"},
            ]
        }
    )
    sets = by_kind(docs, "StatefulSet")
    counts = {name: s["spec"]["replicas"] for name, s in sets.items()}
    assert counts == {
        "demo-gym-checkpoint-worker": 4,
        "demo-gym-checkpoint-model": 2,
        "demo-gym-checkpoint-agent": 3,
        "demo-gym-checkpoint-tools": 1,
        "demo-gym-checkpoint-collection": 1,
        "demo-gym-checkpoint-s3": 1,
    }
    # each pod says how many its server runs: the operator checks every ordinal takes part
    assert (
        sets["demo-gym-checkpoint-agent"]["spec"]["template"]["metadata"]["annotations"]["gym-checkpoint.dev/replicas"]
        == "3"
    )
    configs = by_kind(docs, "ConfigMap")
    model = configs["demo-gym-checkpoint-model-config"]["data"]["config.yaml"]
    assert (
        "base_url: http://demo-gym-checkpoint-worker-{0..3}.demo-gym-checkpoint-worker-headless.prod.svc:8000/v1"
        in model
    )
    agent = configs["demo-gym-checkpoint-agent-config"]["data"]["config.yaml"]
    assert (
        "model_url: http://demo-gym-checkpoint-model-{0..1}.demo-gym-checkpoint-model-headless.prod.svc:8000" in agent
    )
    assert "resources_url: http://demo-gym-checkpoint-tools.prod.svc:8000" in agent  # one replica: its Service
    collection = configs["demo-gym-checkpoint-collection-config"]["data"]["config.yaml"]
    assert (
        "agent: http://demo-gym-checkpoint-agent-{0..2}.demo-gym-checkpoint-agent-headless.prod.svc:8000" in collection
    )
    assert by_kind(docs, "Service")["demo-gym-checkpoint-agent-headless"]["spec"]["clusterIP"] == "None"


def test_duplicate_server_names_are_refused(helm_chart: Any) -> None:
    helm = pytest.importorskip("helm_python")
    twice = {"servers": [{"name": "a", "server": "counter", "role": "resources"}] * 2}
    with pytest.raises(helm.HelmError, match="used twice"):
        helm_chart.render(twice, name="demo", namespace="prod")


def test_operator_runs_kopf_namespaced_with_least_privilege(render: Any) -> None:
    docs = render()
    operator = by_kind(docs, "Deployment")["demo-gym-checkpoint-operator"]
    # leader-elected replicas (a Lease), so a rolling update never leaves the release without an operator; with two
    # on two nodes (anti-affinity) a surge pod would find no node: one at a time is replaced in place
    assert operator["spec"]["replicas"] == 2
    assert operator["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    pod = operator["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"][:3] == ["gym-operator", "--namespace", "prod"]
    env = env_of(container)
    assert env["GYMCKPT_LEADER_LEASE"]["value"] == "demo-gym-checkpoint-operator"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert [
        env[f"GYMCKPT_LEADER_{k}"]["value"] for k in ("LEASE_SECONDS", "RENEW_DEADLINE_SECONDS", "RETRY_SECONDS")
    ] == [
        "15",
        "10",
        "2",
    ]
    assert env["GYMCKPT_CONTROL_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "demo-gym-checkpoint-generated"
    assert env["GYMCKPT_CRD_CHECK"]["value"] == "enabled"
    assert env["GYMCKPT_RELEASE"]["value"] == "demo"
    assert (
        env["GYMCKPT_PARTICIPANT_SELECTOR"]["value"] == "app.kubernetes.io/instance=demo,gym-checkpoint.dev/participant"
    )
    assert env["GYMCKPT_KOPF_SCANNING"]["value"] == "disabled"
    assert pod["serviceAccountName"] == "demo-gym-checkpoint-operator"

    role = by_kind(docs, "Role")["demo-gym-checkpoint-operator"]
    rules = {
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r.get("resourceNames", []))): set(r["verbs"])
        for r in role["rules"]
    }
    least = {
        (("",), ("pods",), ()): {"list", "watch"},
        (("apps",), ("statefulsets",), ()): {"list"},
        (("gym-checkpoint.dev",), ("checkpoints",), ()): {"get", "list", "watch", "patch", "delete", "create"},
        (("gym-checkpoint.dev",), ("restores",), ()): {"list", "watch", "patch", "create"},
        (("gym-checkpoint.dev",), ("checkpointstoragelocations",), ()): {"get", "list"},
        (("gym-checkpoint.dev",), ("checkpointschedules",), ()): {"list", "watch"},
        (
            ("gym-checkpoint.dev",),
            (
                "checkpoints/status",
                "restores/status",
                "checkpointstoragelocations/status",
                "checkpointschedules/status",
            ),
            (),
        ): {"patch"},
        # the keys of the release's own location, by name: the operator is their one reader
        (("",), ("secrets",), ("demo-gym-checkpoint-storage",)): {"get"},
        (("",), ("events",), ()): {"create"},
        # leader election: any Lease may be created (RBAC cannot name what does not exist yet), only its own read
        # and renewed
        (("coordination.k8s.io",), ("leases",), ()): {"create"},
        (("coordination.k8s.io",), ("leases",), ("demo-gym-checkpoint-operator",)): {"get", "update"},
        # at shutdown: is the release going away (its namespace terminating, its Deployment gone)?
        (("",), ("namespaces",), ("prod",)): {"get"},
        (("apps",), ("deployments",), ("demo-gym-checkpoint-operator",)): {"get"},
    }
    assert rules == least  # no other Secret unless a storage location names one
    locations = {
        "team": {"url": "s3://team/gym", "existingSecret": "team-s3"},
        "backup": {"url": "s3://backup/gym", "endpoint": "https://s3.example.com", "existingSecret": "backup-s3"},
        "same-keys": {"url": "s3://team/other", "existingSecret": "team-s3"},
        "plain": {"url": "s3://plain/x"},
    }
    named = render({"storage": {"locations": locations}})
    role = by_kind(named, "Role")["demo-gym-checkpoint-operator"]
    secrets = [r for r in role["rules"] if r["resources"] == ["secrets"]]
    assert secrets == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "verbs": ["get"],
            "resourceNames": ["demo-gym-checkpoint-storage", "backup-s3", "team-s3"],
        }
    ]
    rendered = {
        loc["metadata"]["labels"]["gym-checkpoint.dev/location"]: loc["spec"]
        for loc in by_kind(named, "CheckpointStorageLocation").values()
    }
    assert set(rendered) == {"default", *locations}
    assert rendered["backup"]["endpoint"] == "https://s3.example.com" and rendered["backup"]["bucket"] == "backup"
    assert rendered["plain"]["credential"] == {"name": "demo-gym-checkpoint-storage"}  # the release's keys
    assert rendered["same-keys"] == {**rendered["team"], "prefix": "other"}
    binding = by_kind(docs, "RoleBinding")["demo-gym-checkpoint-operator"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "demo-gym-checkpoint-operator", "namespace": "prod"}
    ]
    # cluster-wide: only the aggregated user roles (no binding, no rule for the operator), and the CRDs hook's
    # (created before an upgrade and deleted once it succeeded: create and update the chart's CRDs, every one in crds/)
    assert set(by_kind(docs, "ClusterRole")) == {
        "prod-demo-gym-checkpoint-view",
        "prod-demo-gym-checkpoint-edit",
        "prod-demo-gym-checkpoint-crds",
    }
    assert set(by_kind(docs, "ClusterRoleBinding")) == {"prod-demo-gym-checkpoint-crds"}
    crds = by_kind(docs, "ClusterRole")["prod-demo-gym-checkpoint-crds"]
    assert crds["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    assert [(r["resources"], r.get("resourceNames"), r["verbs"]) for r in crds["rules"]] == [
        (["customresourcedefinitions"], None, ["create"]),
        (
            ["customresourcedefinitions"],
            [yaml.safe_load(crd.read_text())["metadata"]["name"] for crd in sorted((CHART / "crds").glob("*.yaml"))],
            ["get", "update"],
        ),
    ]
    assert not by_kind(render(VARIANTS["namespace-scoped-deployer"]), "ClusterRoleBinding")
    assert "GYMCKPT_NAMESPACE" not in env and "GYMCKPT_LOG_LEVEL" not in env  # the operator reads neither
    assert container["command"][container["command"].index("--log-format") + 1] == "json"
    assert "--verbose" not in container["command"] and "--quiet" not in container["command"]


def test_cluster_scanning_adds_only_read_access_to_namespaces_and_crds(render: Any) -> None:
    docs = render(VARIANTS["cluster-scanning-no-operator-sa"])
    (cluster_role,) = [r for n, r in by_kind(docs, "ClusterRole").items() if n.endswith("-scanning")]
    assert [(r["resources"], sorted(r["verbs"])) for r in cluster_role["rules"]] == [
        (["namespaces"], ["get", "list", "watch"]),
        (["customresourcedefinitions"], ["get", "list", "watch"]),
    ]
    # the servers' own (and the secrets and uninstall hooks', created and deleted with their Jobs)
    assert set(by_kind(docs, "ServiceAccount")) == {
        "demo-gym-checkpoint-server",
        "demo-gym-checkpoint-secrets",
        "demo-gym-checkpoint-uninstall",
        "demo-gym-checkpoint-crds",
    }
    assert (
        by_kind(docs, "Deployment")["demo-gym-checkpoint-operator"]["spec"]["template"]["spec"]["serviceAccountName"]
        == "ops"
    )


def test_explicit_secret_values_are_used_verbatim(render: Any) -> None:
    assert not [n for n in by_kind(render(VARIANTS["explicit-secrets"]), "Job") if "secrets" in n]  # none generated
    docs = render(VARIANTS["explicit-secrets"])
    secrets = by_kind(docs, "Secret")
    assert base64.b64decode(secrets["demo-gym-checkpoint-control"]["data"]["token"]).decode() == "a" * 32
    assert base64.b64decode(secrets["demo-gym-checkpoint-s3"]["data"]["AWS_ACCESS_KEY_ID"]).decode() == "AKIA0000"
    (location,) = by_kind(docs, "CheckpointStorageLocation").values()
    assert location["spec"]["provider"] == "file" and location["spec"]["prefix"] == "/var/lib/ckpt"
    operator = by_kind(docs, "Deployment")["demo-gym-checkpoint-operator"]["spec"]["template"]["spec"]["containers"][0]
    assert env_of(operator)["GYMCKPT_GATEWAY_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "ops-gateway",
        "key": "gateway-key",
    }
