"""A transaction outlives its operator: an operator killed mid-transaction leaves no server paused (the pause
leases end it) and the next one ends the transaction; one restarted mid-persist, or a standby that takes over the
Kubernetes Lease of a killed leader, carries on the same transaction (Event TakenOver); an operator that loses its
leadership stops at once, and one stopped by SIGTERM releases its Lease as soon as kopf has stopped."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import httpx
import pytest
from tests.operator.harness import (
    RELEASE,
    PauseMonitor,
    Stack,
    WithholdingProxy,
    admission_is_open,
    apply,
    checkpoint_doc,
    get,
    leadership_of,
    leads,
    phase,
    reasons_of,
    report_pause,
    status_of,
    wait_for,
)

pytestmark = pytest.mark.k8s


@pytest.fixture
def kemu(kemu_shared: Any) -> Any:
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


def test_operator_killed_mid_transaction_never_leaves_the_stack_paused(operator_env, kubectl, tmp_path) -> None:
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported", "counter-1": "restart_only"})
    stack.start()
    stack.create_pods()
    operator = start_operator(stack)
    with httpx.Client(base_url=stack.url("counter-1")) as http:
        http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "live"})
    # counter-1 never drains, so the prepare waits its 10 s for it: the operator is killed inside that wait
    apply(kubectl, checkpoint_doc("interrupted", prepareTimeoutSeconds=10, leaseSeconds=5))

    def admission_open() -> bool:
        return all(
            httpx.get(
                f"{stack.url(name)}/ng-control/v1/checkpoint/status", headers={"authorization": f"Bearer {stack.token}"}
            ).json()["admission_open"]
            for name in stack.modes
        )

    def phase() -> str | None:
        return (get(kubectl, "checkpoint", "interrupted").get("status") or {}).get("phase")

    # the servers themselves paused (a kill right after "Preparing" could find nothing paused, as seen under load),
    # and "Preparing" in the resource's status: the operator writes status in the background, never holding the
    # transaction for it, so the prepare calls can pause the stack before it is in (seen in a CI run). Within the
    # 10 s prepare timeout, after which the Checkpoint would fail by itself.
    wait_for(
        lambda: not admission_open() and phase() == "Preparing",
        timeout=8,
        what="the stack paused and Preparing written",
    )
    os.killpg(operator.pid, signal.SIGKILL)  # the operator dies mid-transaction
    operator.wait(timeout=10)
    assert get(kubectl, "checkpoint", "interrupted")["status"]["phase"] == "Preparing"  # nothing ended it
    wait_for(admission_open, timeout=20, what="pause lease expiry reopening admission")  # no coordinator: leases end it

    start_operator(stack)  # a new operator picks the unfinished Checkpoint up again and ends it cleanly
    kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "checkpoint/interrupted", "--timeout=90s", timeout=100)
    status = get(kubectl, "checkpoint", "interrupted")["status"]
    assert status["reason"] == "Blocked" and status["blockers"][0]["participant"] == "counter-1"
    assert admission_open()
    stack.kill()


def test_fault_operator_restarted_mid_persist(operator_env, kubectl, tmp_path) -> None:
    """The operator is SIGKILLed while a sync checkpoint's persist is in flight (a proxy holds it; the server gets it
    late, as a request that outlived its caller). A new operator starts at once and repeats the same checkpoint id:
    every server answers its repeated verbs with the first answer, the checkpoint is published and the stack resumed
    long before the 120 s pause lease (the new operator first waits for the dead one's Kubernetes Lease), and the
    Checkpoint ends Completed."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported", "counter-1": "exported"})
    stack.start()
    proxy = WithholdingProxy(stack.url("counter-1"), verb="persist", forward_withheld=True)
    try:
        stack.create_pods(control_ports={"counter-1": proxy.port})
        operator = start_operator(stack)
        with httpx.Client(base_url=stack.url("counter-0")) as http:
            http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "r0"})
        proxy.hold.set()
        with PauseMonitor(stack) as pause:
            apply(
                kubectl, checkpoint_doc("restarted", prepareTimeoutSeconds=10, leaseSeconds=120, method="sync")
            )  # a persist under the pause
            wait_for(proxy.withheld.is_set, timeout=30, what="the persist to be under way")
            assert phase(kubectl, "checkpoint", "restarted") == "Persisting"
            killed = time.monotonic()
            os.killpg(operator.pid, signal.SIGKILL)
            operator.wait(timeout=10)
            proxy.hold.clear()
            start_operator(stack)
            wait_for(lambda: admission_is_open(stack), timeout=30, what="the stack to resume")
            resumed_after = time.monotonic() - killed
            kubectl(
                "wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/restarted", "--timeout=60s", timeout=70
            )
        report_pause("operator restarted mid-persist", pause, resumed_after_kill_s=round(resumed_after, 3))
        assert resumed_after < 90, "the stack waited for its pause lease (120 s)"
        status = get(kubectl, "checkpoint", "restarted")["status"]
        assert status["reason"] == "Completed" and status["records"] == 1
        for name in stack.modes:
            assert status_of(stack, name)["phase"] == "open"
    finally:
        proxy.stop()
        stack.kill()


def test_two_operator_replicas_only_the_leader_acts_and_a_standby_finishes_what_a_killed_leader_left(
    operator_env, kubectl, seaweed, tmp_path
) -> None:
    """Two operator processes of one release: one holds the Kubernetes Lease and runs the Checkpoint, the other stands
    by and does nothing (no kopf, no Event, no call). The leader is SIGKILLed while the checkpoint's persist is in
    flight (a proxy holds it; the server gets it late, as a request that outlived its caller): the standby takes the
    Lease once it went unrenewed, carries on the same transaction (same checkpoint id: Event TakenOver), the
    Checkpoint completes, one checkpoint is stored, and no server is left paused."""
    start_operator, location = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported", "counter-1": "exported"})
    stack.start()
    proxy = WithholdingProxy(stack.url("counter-1"), verb="persist", forward_withheld=True)
    try:
        stack.create_pods(control_ports={"counter-1": proxy.port})
        leader = start_operator(stack, log_name="leader.log")
        standby = start_operator(stack, log_name="standby.log", standby="yes")
        assert not leads(standby.health)
        holder = leadership_of(kubectl)["spec"]["holderIdentity"]
        assert httpx.get(f"http://127.0.0.1:{leader.health}/healthz").json()["identity"] == holder
        with httpx.Client(base_url=stack.url("counter-0")) as http:
            http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "r0"})
        proxy.hold.set()
        apply(kubectl, checkpoint_doc("handover", prepareTimeoutSeconds=10, leaseSeconds=120, method="sync"))
        wait_for(proxy.withheld.is_set, timeout=60, what="the persist to be under way")
        wait_for(lambda: phase(kubectl, "checkpoint", "handover") == "Persisting", what="Persisting written")
        checkpoint_id = get(kubectl, "checkpoint", "handover")["status"]["checkpointId"]
        standing_by = (tmp_path / "standby.log").read_text()
        assert f"is held by {holder}" in standing_by and "handover" not in standing_by  # it never touched it
        assert not leads(standby.health)

        os.killpg(leader.pid, signal.SIGKILL)  # the leader dies mid-transaction
        leader.wait(timeout=10)
        proxy.hold.clear()  # its persist reaches the server late
        wait_for(lambda: leads(standby.health), timeout=60, what="the standby to take the Lease")
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/handover", "--timeout=90s", timeout=100)
        status = get(kubectl, "checkpoint", "handover")["status"]
        assert status["checkpointId"] == checkpoint_id and status["records"] == 1
        wait_for(lambda: admission_is_open(stack), timeout=30, what="every server open")
        for name in stack.modes:
            assert status_of(stack, name)["phase"] == "open"
        bucket, prefix = location[len("s3://") :].split("/", 1)
        stored = seaweed.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/checkpoints/")
        ids = {o["Key"][len(f"{prefix}/checkpoints/") :].split("/", 1)[0] for o in stored.get("Contents", [])}
        assert ids == {checkpoint_id}  # one transaction, carried on: not a second one
        assert reasons_of(kubectl, "handover").count("TakenOver") == 1
        taken = leadership_of(kubectl)["spec"]
        assert taken["holderIdentity"] != holder and taken["leaseTransitions"] == 1
        assert "became the leader" in (tmp_path / "standby.log").read_text()
    finally:
        proxy.stop()
        stack.kill()


def test_an_operator_that_loses_its_leadership_stops_at_once(operator_env, kubectl, tmp_path) -> None:
    """Another holder in the Kubernetes Lease (what a leader cut off from the API server for longer than the
    leadership's duration would find): the operator exits with status 3 at its next renewal, without waiting for
    anything it runs."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})
    stack.start()
    stack.create_pods()
    operator = start_operator(stack)
    kubectl(
        "patch",
        "lease",
        f"{RELEASE}-gym-checkpoint-operator",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"holderIdentity": "another-operator_0123456789"}}),
    )
    assert operator.wait(timeout=30) == 3
    log = (tmp_path / "operator.log").read_text()
    assert (
        "the Lease is held by another-operator_0123456789" in log and "exiting so that only the new leader acts" in log
    )
    stack.kill()


def test_a_leader_stopped_by_sigterm_leaves_kopf_no_task_to_wait_for_and_releases_its_lease(
    operator_env, kubectl, tmp_path
) -> None:
    """SIGTERM, as the kubelet stops the leader's pod (a rolling update, a drain): kopf stops with no task left to
    wait for, the Kubernetes Lease is released for a standby to take at once, and the process exits 0. Before, kopf's
    own waiter of the operator's stop flag stayed pending after a signal, and kopf gave it 5 s as a hung task before
    it returned and the Lease was released."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})  # its control token only: no server is needed
    operator = start_operator(stack, verbose=True)
    assert leadership_of(kubectl)["spec"]["holderIdentity"]
    os.killpg(operator.pid, signal.SIGTERM)
    assert operator.wait(timeout=30) == 0
    log = (tmp_path / "operator.log").read_text()
    assert "Signal SIGTERM is received" in log, log[-3000:]
    # kopf's debug line when, its root tasks stopped, it finds none of the tasks it started still running
    assert "Hung tasks stopping is skipped: no tasks given" in log, log[-3000:]
    assert "released Lease" in log and not leadership_of(kubectl)["spec"].get("holderIdentity")
