"""The operator finds every replica of a replicated server: each pod is its own participant and says which
ordinal of how many it is (pods as the API returns them, no cluster)."""
from __future__ import annotations

from typing import Any

import pytest

from gym_operator.discovery import DiscoveryError, participants_from_pods
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
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "status": {"pod_ip": "127.0.0.1", "phase": "Running"}}


def test_every_pod_of_a_replicated_server_is_its_replica() -> None:
    refs = participants_from_pods([
        pod("gym-agent-1", "agent", "agent", "2", index="1"),
        pod("gym-agent-0", "agent", "agent", "2"),  # no pod-index label (older clusters): the name's suffix
        pod("gym-model-0", "model", "model", "1", index="0"),
        pod("gym-legacy-0", "legacy", "resources", None),  # a pod the chart did not annotate: one replica
    ])
    by_id = {r.participant_id: r for r in refs}
    assert by_id["gym-agent-0"].replica == Replica(group="agent", ordinal=0, replicas=2)
    assert by_id["gym-agent-1"].replica == Replica(group="agent", ordinal=1, replicas=2)
    assert by_id["gym-model-0"].replica == Replica(group="model", ordinal=0, replicas=1)
    assert by_id["gym-legacy-0"].replica is None
    assert [r.role for r in refs] == [Role.MODEL, Role.AGENT, Role.AGENT, Role.RESOURCES]  # in prepare order
    check_replica_sets(refs)  # whole


def test_a_missing_replica_is_caught_before_any_participant_is_asked() -> None:
    refs = participants_from_pods([pod("gym-agent-0", "agent", "agent", "3"), pod("gym-agent-2", "agent", "agent", "3")])
    with pytest.raises(TransactionError, match=r"agent: runs 3 replicas but ordinals \[1\] did not answer"):
        check_replica_sets(refs)


@pytest.mark.parametrize(("name", "replicas", "index"), [
    ("gym-agent-0", "two", None),  # not a number
    ("gym-agent-2", "2", None),  # an ordinal past the count
    ("gym-agent", "2", None),  # no ordinal at all
    ("gym-agent-0", "0", "0"),  # no replicas
])
def test_a_pod_that_cannot_be_a_replica_is_named(name: str, replicas: str, index: str | None) -> None:
    with pytest.raises(DiscoveryError, match=f"pod {name}: annotation gym-checkpoint.dev/replicas"):
        participants_from_pods([pod(name, "agent", "agent", replicas, index)])
