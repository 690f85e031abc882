"""A Checkpoint's transaction (gym_operator.controllers.checkpoint) with the real kopf operator on the emulator:
it completes, fails with a reason (blocked, refused), waits for the stack, picks its pods by selector, and reports
what the schema keeps. Real counter servers as processes behind the Pods."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import yaml
from tests.operator.harness import (
    RELEASE,
    Stack,
    admission_is_open,
    apply,
    checkpoint_doc,
    completed_checkpoint,
    get,
    phase,
    wait_for,
)

pytestmark = pytest.mark.k8s


@pytest.fixture
def kemu(kemu_shared: Any) -> Any:
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


def test_blocked_checkpoint_fails_and_second_one_waits(operator_env, kubectl, tmp_path) -> None:
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported", "counter-1": "restart_only"})
    stack.start()
    stack.create_pods()
    start_operator(stack)
    with httpx.Client(base_url=stack.url("counter-1")) as http:
        http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "live"})

    apply(kubectl, checkpoint_doc("slow", prepareTimeoutSeconds=3))
    wait_for(lambda: get(kubectl, "checkpoint", "slow").get("status", {}).get("phase") == "Preparing", what="Preparing")
    apply(kubectl, checkpoint_doc("second", prepareTimeoutSeconds=1))
    pending = wait_for(
        lambda: (s := get(kubectl, "checkpoint", "second").get("status", {})).get("phase") == "Pending" and s,
        what="second Pending",
    )
    assert pending["reason"] == "WaitingForStack" and "Checkpoint slow" in pending["message"]

    kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "checkpoint/slow", "--timeout=60s", timeout=70)
    failed = get(kubectl, "checkpoint", "slow")["status"]
    assert failed["reason"] == "Blocked"
    assert failed["blockers"] == [
        {
            "participant": "counter-1",
            "kind": "session",
            "id": failed["blockers"][0]["id"],
            "detail": "restart_only server holds a live session of rollout live",
        }
    ]
    kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "checkpoint/second", "--timeout=60s", timeout=70)
    # the stack was resumed: both servers admit data again
    for name in stack.modes:
        status = httpx.get(
            f"{stack.url(name)}/ng-control/v1/checkpoint/status", headers={"authorization": f"Bearer {stack.token}"}
        ).json()
        assert status["admission_open"] and status["checkpoint_id"] is None
    stack.kill()


def test_a_blocked_checkpoint_ends_failed_and_reopens_the_stack_before_its_lease(
    operator_env, kubectl, tmp_path
) -> None:
    """On an API server that enforces the CRD's enum: a checkpoint blocked by a live session ends
    Failed (reason Blocked) right after its prepare deadline, and the stack is open again without waiting for the
    60 s lease."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "restart_only"})
    stack.start()
    stack.create_pods()
    start_operator(stack)
    try:
        with httpx.Client(base_url=stack.url("counter-0")) as http:
            http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "live"})
        apply(kubectl, checkpoint_doc("blocked", prepareTimeoutSeconds=1, leaseSeconds=60))
        wait_for(lambda: phase(kubectl, "checkpoint", "blocked") == "Failed", timeout=20, what="Failed")
        assert get(kubectl, "checkpoint", "blocked")["status"]["reason"] == "Blocked"
        assert admission_is_open(stack)
    finally:
        stack.kill()


def test_refusals_end_in_failed_with_a_reason(operator_env, kubectl, tmp_path) -> None:
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})
    start_operator(stack)  # no participant pods at all
    apply(kubectl, checkpoint_doc("lonely"))
    apply(
        kubectl,
        {
            "apiVersion": "gym-checkpoint.dev/v1alpha1",
            "kind": "Restore",
            "metadata": {"name": "orphan"},
            "spec": {"checkpointRef": {"name": "missing"}},
        },
    )
    kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "checkpoint/lonely", "--timeout=60s", timeout=70)
    kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "restore/orphan", "--timeout=60s", timeout=70)
    assert get(kubectl, "checkpoint", "lonely")["status"]["reason"] == "NoParticipants"
    orphan = get(kubectl, "restore", "orphan")["status"]
    assert orphan["reason"] == "CheckpointNotFound" and "missing" in orphan["message"]
    assert {c["type"]: c["status"] for c in orphan["conditions"]}["Failed"] == "True"


def test_status_follows_the_schema_and_kubernetes_conventions(operator_env, kubectl, tmp_path) -> None:
    """What the operator reports survives the API server's pruning (status.records, episodes);
    schema defaults are applied; top-level observedGeneration follows metadata.generation; spec is immutable but
    for ttl and deletionPolicy (a CEL transition rule), and a changed ttl is handled (status.expiration)."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})
    stack.start()
    stack.create_pods()
    start_operator(stack)
    try:
        status = completed_checkpoint(kubectl, stack, "counted")
        assert status["records"] == 1 and status["participants"][0]["records"] == 1
        assert status["episodes"] == 0  # live episodes are the rollout controller's; this stack has none
        doc = get(kubectl, "checkpoint", "counted")
        assert doc["spec"]["leaseSeconds"] == 30 and doc["spec"]["deletionPolicy"] == "Retain"  # schema defaults
        assert doc["spec"]["selector"] == {} and doc["spec"]["storageLocation"] == "default"
        assert status["observedGeneration"] == doc["metadata"]["generation"] == 1
        assert "expiration" not in status
        transitions = {c["type"]: c["lastTransitionTime"] for c in status["conditions"]}

        refused = kubectl(
            "patch", "checkpoint", "counted", "--type=merge", "-p", '{"spec": {"leaseSeconds": 60}}', check=False
        )
        assert refused.returncode != 0 and "only spec.ttl and spec.deletionPolicy may change" in refused.stderr
        kubectl("patch", "checkpoint", "counted", "--type=merge", "-p", '{"spec": {"ttl": "240h"}}')
        changed = wait_for(
            lambda: (d := get(kubectl, "checkpoint", "counted"))["status"].get("observedGeneration") == 2 and d,
            what="observedGeneration 2",
        )
        created = changed["metadata"]["creationTimestamp"]
        import datetime as dt

        expected = dt.datetime.fromisoformat(created.replace("Z", "+00:00")) + dt.timedelta(hours=240)
        assert changed["status"]["expiration"] == expected.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert {c["type"]: c["lastTransitionTime"] for c in changed["status"]["conditions"]} == transitions

        stack.kill()
        stack.start()
        apply(
            kubectl,
            {
                "apiVersion": "gym-checkpoint.dev/v1alpha1",
                "kind": "Restore",
                "metadata": {"name": "fixed"},
                "spec": {"checkpointRef": {"name": "counted"}},
            },
        )
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "restore/fixed", "--timeout=60s", timeout=70)
        assert get(kubectl, "restore", "fixed")["status"]["records"] == 1
        refused = kubectl(
            "patch", "restore", "fixed", "--type=merge", "-p", '{"spec": {"leaseSeconds": 60}}', check=False
        )
        assert refused.returncode != 0 and "spec is immutable" in refused.stderr
    finally:
        stack.kill()


def test_selector_match_expressions_pick_the_pods(operator_env, kubectl, tmp_path) -> None:
    """`selector.matchExpressions` (In, NotIn, Exists, DoesNotExist) with matchLabels, as in a
    Kubernetes LabelSelector; an In without values is refused by the CRD's rule."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported", "counter-1": "exported", "counter-2": "exported"})
    stack.start()
    stack.create_pods(labels={"counter-0": {"tier": "a"}, "counter-1": {"tier": "b"}})
    start_operator(stack)
    try:
        cases = {
            "only-a": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]},
            "not-a": {
                "matchLabels": {"app.kubernetes.io/instance": RELEASE},
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}],
            },
            "tiered": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
            "untiered": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
        }
        expected = {
            "only-a": ["counter-0"],
            "not-a": ["counter-1", "counter-2"],
            "tiered": ["counter-0", "counter-1"],
            "untiered": ["counter-2"],
        }
        for name, selector in cases.items():
            apply(kubectl, checkpoint_doc(name, prepareTimeoutSeconds=10, selector=selector))
            kubectl(
                "wait", "--for=jsonpath={.status.phase}=Completed", f"checkpoint/{name}", "--timeout=60s", timeout=70
            )
            status = get(kubectl, "checkpoint", name)["status"]
            assert sorted(p["id"] for p in status["participants"]) == expected[name], name
        bad = kubectl(
            "apply",
            "-f",
            "-",
            check=False,
            input=yaml.safe_dump(
                checkpoint_doc("bad", selector={"matchExpressions": [{"key": "tier", "operator": "In"}]})
            ),
        )
        assert bad.returncode != 0 and "In and NotIn need values" in bad.stderr
    finally:
        stack.kill()
