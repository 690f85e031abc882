"""The operator finds every replica of a replicated server: each pod is its own participant and says which
ordinal of how many it is (pods as the API returns them, no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from gym_operator.discovery import (
    DiscoveryError,
    ReplicaCountMismatch,
    check_replica_counts,
    participants_from_pods,
    replicated_statefulsets,
)
from gym_services.control.models import Replica
from gym_services.control.protocol import Role
from gym_services.coordination.coordinator import TransactionError, check_replica_sets


def pod(name: str, server: str, role: str, replicas: str | None, index: str | None = None) -> dict[str, Any]:
    labels = {"gym-checkpoint.dev/role": role, "gym-checkpoint.dev/participant": server}
    if index is not None:
        labels["apps.kubernetes.io/pod-index"] = index
    annotations = {"gym-checkpoint.dev/control-port": "8080"}
    if replicas is not None:
        annotations["gym-checkpoint.dev/replicas"] = replicas
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "status": {"pod_ip": "127.0.0.1", "phase": "Running"},
    }


def test_every_pod_of_a_replicated_server_is_its_replica() -> None:
    refs = participants_from_pods(
        [
            pod("gym-agent-1", "agent", "agent", "2", index="1"),
            pod("gym-agent-0", "agent", "agent", "2"),  # no pod-index label (older clusters): the name's suffix
            pod("gym-model-0", "model", "model", "1", index="0"),
            pod("gym-legacy-0", "legacy", "resources", None),  # a pod the chart did not annotate: one replica
        ]
    )
    by_id = {r.participant_id: r for r in refs}
    assert by_id["gym-agent-0"].replica == Replica(group="agent", ordinal=0, replicas=2)
    assert by_id["gym-agent-1"].replica == Replica(group="agent", ordinal=1, replicas=2)
    assert by_id["gym-model-0"].replica == Replica(group="model", ordinal=0, replicas=1)
    assert by_id["gym-legacy-0"].replica is None
    assert [r.role for r in refs] == [Role.MODEL, Role.AGENT, Role.AGENT, Role.RESOURCES]  # in prepare order
    check_replica_sets(refs)  # whole


def test_a_missing_replica_is_caught_before_any_participant_is_asked() -> None:
    refs = participants_from_pods(
        [pod("gym-agent-0", "agent", "agent", "3"), pod("gym-agent-2", "agent", "agent", "3")]
    )
    with pytest.raises(TransactionError, match=r"agent: runs 3 replicas but ordinals \[1\] did not answer"):
        check_replica_sets(refs)


@pytest.mark.parametrize(
    ("name", "replicas", "index"),
    [
        ("gym-agent-0", "two", None),  # not a number
        ("gym-agent-2", "2", None),  # an ordinal past the count
        ("gym-agent", "2", None),  # no ordinal at all
        ("gym-agent-0", "0", "0"),  # no replicas
    ],
)
def test_a_pod_that_cannot_be_a_replica_is_named(name: str, replicas: str, index: str | None) -> None:
    with pytest.raises(DiscoveryError, match=f"pod {name}: annotation gym-checkpoint.dev/replicas"):
        participants_from_pods([pod(name, "agent", "agent", replicas, index)])


def test_pods_as_the_api_serves_them_in_json() -> None:
    """A pod as plain JSON from the API (kubectl get -o json, a watch event's body) spells its fields as Kubernetes
    does, podIP and containerPort included: read as such, not by camel-casing the client's Python names."""
    raw = {
        "metadata": {
            "name": "gym-agent-1",
            "deletionTimestamp": None,
            "labels": {
                "gym-checkpoint.dev/role": "agent",
                "gym-checkpoint.dev/participant": "agent",
                "apps.kubernetes.io/pod-index": "1",
            },
            "annotations": {"gym-checkpoint.dev/replicas": "2"},
        },
        "spec": {"containers": [{"name": "server", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {"podIP": "10.1.2.3", "phase": "Running"},
    }
    (ref,) = participants_from_pods([raw])
    assert ref.url == "http://10.1.2.3:8000" and ref.replica == Replica(group="agent", ordinal=1, replicas=2)
    terminating = {**raw, "metadata": {**raw["metadata"], "deletionTimestamp": "2026-12-01T00:00:00Z"}}
    with pytest.raises(DiscoveryError, match="pod gym-agent-1 is terminating"):
        participants_from_pods([terminating])


def owned(pod_: dict[str, Any], statefulset: str) -> dict[str, Any]:
    pod_["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": statefulset, "uid": "u1", "controller": True}
    ]
    return pod_


def test_pods_of_a_statefulset_scaled_outside_the_chart_are_refused_naming_both_counts() -> None:
    pods = [owned(pod(f"gym-agent-{i}", "agent", "agent", "2", index=str(i)), "gym-agent") for i in (0, 1)]
    pods.append(owned(pod("gym-model-0", "model", "model", "1", index="0"), "gym-model"))
    assert replicated_statefulsets(pods) == ["gym-agent", "gym-model"]
    check_replica_counts(pods, {"gym-agent": 2, "gym-model": 1})  # they agree
    check_replica_counts(pods, {"gym-agent": None, "gym-model": 1})  # a StatefulSet gone: nothing to compare
    # `kubectl scale --replicas 3`: the template (and so every pod) still says 2, a third pod may not even exist yet
    with pytest.raises(
        ReplicaCountMismatch,
        match=r"agent: StatefulSet gym-agent has replicas 3 but its pod gym-agent-0 "
        r"says 2 \(gym-checkpoint.dev/replicas\).*helm upgrade",
    ) as refused:
        check_replica_counts(pods, {"gym-agent": 3, "gym-model": 1})
    assert "gym-model" not in str(refused.value)
    with pytest.raises(ReplicaCountMismatch, match="StatefulSet gym-agent has replicas 1 but"):  # scaled down
        check_replica_counts(pods, {"gym-agent": 1, "gym-model": 1})
    # pods no StatefulSet owns, or not annotated, are nothing to check
    assert (
        replicated_statefulsets([pod("gym-x-0", "x", "agent", "2"), owned(pod("gym-y-0", "y", "agent", None), "y")])
        == []
    )
