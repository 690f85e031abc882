"""When the stack's StatefulSets have settled: label selectors as the API server reads them, and
the rollout states `kubectl rollout status` waits through (objects as the API returns them, no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from gym_operator.discovery import (
    DiscoveryError,
    StackRolling,
    participants_from_pods,
    rollout_problems,
    selector_matches,
)


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        (
            "app.kubernetes.io/instance=gym,gym-checkpoint.dev/participant",
            {"app.kubernetes.io/instance": "gym", "gym-checkpoint.dev/participant": "a"},
            True,
        ),
        ("app.kubernetes.io/instance=gym,gym-checkpoint.dev/participant", {"app.kubernetes.io/instance": "gym"}, False),
        ("a==1,b!=2", {"a": "1", "b": "3"}, True),
        ("a==1,b!=2", {"a": "1", "b": "2"}, False),
        ("b!=2", {}, True),
        ("tier in (x, y),!legacy", {"tier": "y"}, True),
        ("tier in (x,y),!legacy", {"tier": "y", "legacy": ""}, False),
        ("tier notin (x,y)", {"tier": "z"}, True),
        ("tier notin (x,y)", {"tier": "x"}, False),
        ("tier in (x,y)", {}, False),
    ],
)
def test_label_selectors_match_as_the_api_server_reads_them(
    selector: str, labels: dict[str, str], matches: bool
) -> None:
    assert selector_matches(selector, labels) is matches


def test_an_unreadable_selector_is_an_error() -> None:
    with pytest.raises(DiscoveryError, match="cannot read 'a b c'"):
        selector_matches("a b c", {})


def sts(
    replicas: int = 3,
    generation: int = 2,
    observed: int | None = 2,
    current: str = "r2",
    update: str = "r2",
    updated: int | None = None,
    ready: int | None = None,
    strategy: str = "RollingUpdate",
    partition: int | None = None,
) -> dict[str, Any]:
    update_strategy: dict[str, Any] = {"type": strategy}
    if partition is not None:
        update_strategy["rollingUpdate"] = {"partition": partition}
    return {
        "metadata": {"name": "gym-model", "generation": generation},
        "spec": {"replicas": replicas, "updateStrategy": update_strategy},
        "status": {
            "observedGeneration": observed,
            "currentRevision": current,
            "updateRevision": update,
            "updatedReplicas": replicas if updated is None else updated,
            "readyReplicas": replicas if ready is None else ready,
        },
    }


def pod(ordinal: int, revision: str = "r2", terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"gym-model-{ordinal}",
        "labels": {"controller-revision-hash": revision, "gym-checkpoint.dev/role": "model"},
        "ownerReferences": [{"kind": "StatefulSet", "name": "gym-model"}],
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running", "podIP": "10.0.0.1"}}


PODS = [pod(0), pod(1), pod(2)]


@pytest.mark.parametrize(
    ("statefulset", "pods", "problem"),
    [
        (sts(), PODS, None),
        (sts(observed=1), PODS, "its controller has not acted on generation 2 yet"),
        (sts(current="r1", updated=1), PODS, "rolling out revision r2, 1 of 3 pods updated"),
        (sts(current="r1", updated=3), PODS, "rolling out revision r2, 3 of 3 pods updated"),  # not yet marked done
        (sts(ready=2), PODS, "2 of 3 pods ready"),
        (sts(), [pod(0), pod(1), pod(2, terminating=True)], "pod gym-model-2 is terminating"),
        (sts(), [pod(0, "r1"), pod(1), pod(2)], "pod gym-model-0 is still at revision r1"),
        (sts(), PODS[:2], "2 of 3 pods exist"),
        # OnDelete: the admin replaces pods; old-revision pods that run and are ready are the stack
        (sts(strategy="OnDelete", current="r1", updated=1), [pod(0, "r1"), pod(1, "r1"), pod(2)], None),
        # a partition keeps the pods below it at the old revision on purpose
        (sts(partition=2, current="r1", updated=1), [pod(0, "r1"), pod(1, "r1"), pod(2)], None),
        (sts(partition=1, current="r1", updated=1), [pod(0, "r1"), pod(1, "r1"), pod(2)], "1 of 3 pods updated"),
    ],
)
def test_a_statefulset_has_settled_only_with_every_pod_ready_at_the_update_revision(
    statefulset: dict[str, Any], pods: list[dict[str, Any]], problem: str | None
) -> None:
    found = rollout_problems([statefulset], pods)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith("StatefulSet gym-model: ") and problem in found[0], found


def test_a_pod_that_is_terminating_or_not_running_is_a_wait_not_a_refusal() -> None:
    terminating = pod(0, terminating=True)
    terminating["metadata"]["annotations"] = {"gym-checkpoint.dev/control-port": "8080"}
    with pytest.raises(StackRolling, match="pod gym-model-0 is terminating"):
        participants_from_pods([terminating])
    pending = {**pod(1), "status": {"phase": "Pending"}}
    with pytest.raises(StackRolling, match="pod gym-model-1 is not running yet"):
        participants_from_pods([pending])
