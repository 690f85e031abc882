"""A Checkpoint's end (gym_operator.controllers.deletion) with the real kopf operator on the emulator: deleted
mid-transaction it is cancelled at once; deleted later, its deletionPolicy decides about its stored objects, never
removed while a Restore reads them, and storage that never answers is given up after bounded tries; its spec.ttl
deletes it."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from tests.operator.harness import (
    FINALIZER,
    GROUP,
    Operators,
    PauseMonitor,
    Stack,
    WithholdingProxy,
    admission_is_open,
    apply,
    checkpoint_doc,
    completed_checkpoint,
    completed_earlier,
    finalized,
    get,
    gone,
    reasons_of,
    report_pause,
    status_of,
    stored_objects,
    wait_for,
)

pytestmark = pytest.mark.k8s


@pytest.fixture
def kemu(kemu_shared: Any) -> Any:
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


def test_a_checkpoint_deleted_mid_prepare_is_cancelled_and_reopens_the_stack_at_once(
    operator_env, kubectl, tmp_path
) -> None:
    """Deletion like Velero: deleting a Checkpoint mid-prepare cancels it. Its finalizer keeps
    it until the operator has aborted every server (reopened at once, not at the end of the 60 s lease, nor of the
    30 s prepare deadline) and written the outcome; then it is gone. (Before the fix the next status write
    answered 404 inside the coordinator and abort was never sent.)"""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "restart_only", "counter-1": "exported"})
    stack.start()
    stack.create_pods()
    start_operator(stack)
    try:
        with httpx.Client(base_url=stack.url("counter-0")) as http:
            http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "live"})
        with PauseMonitor(stack) as pause:
            apply(kubectl, checkpoint_doc("doomed", prepareTimeoutSeconds=30, leaseSeconds=60))
            wait_for(lambda: not admission_is_open(stack), timeout=20, what="the stack to pause")
            doc = get(kubectl, "checkpoint", "doomed")
            assert doc["metadata"]["finalizers"] == [FINALIZER]
            deleted = time.monotonic()
            kubectl("delete", "checkpoint", "doomed", "--wait=false")
            wait_for(
                lambda: admission_is_open(stack), timeout=10, what="the stack to reopen (lease 60 s, prepare 30 s)"
            )
            reopened = time.monotonic() - deleted
            wait_for(
                lambda: kubectl("get", "checkpoint", "doomed", check=False).returncode != 0,
                timeout=20,
                what="the Checkpoint to go once cancelled",
            )
        report_pause("checkpoint deleted mid-prepare", pause, reopened_after_delete_s=round(reopened, 3))
        assert pause.longest() < 10
        events = json.loads(kubectl("get", "events", "-o", "json").stdout)["items"]
        reasons = [e["reason"] for e in events if e["involvedObject"]["name"] == "doomed"]
        assert "Preparing" in reasons and "Aborting" in reasons and "Deleted" in reasons, reasons
        for name in stack.modes:
            assert status_of(stack, name)["checkpoint_id"] is None
    finally:
        stack.kill()


def test_deleting_a_checkpoint_follows_its_deletion_policy_and_never_removes_what_a_restore_reads(
    operator_env, kubectl, seaweed, tmp_path
) -> None:
    """Deletion like Velero: a deleted Checkpoint with `deletionPolicy: Retain` (the default) leaves its stored
    objects; with `Delete` they are removed, but only once no Restore reads them: a Restore mid-restore (a proxy
    withholds one server's restore call) holds the deletion (finalizer) until it completes."""
    start_operator, location = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported", "counter-1": "exported"})
    stack.start()
    proxy = WithholdingProxy(stack.url("counter-1"), verb="restore", forward_withheld=True)
    try:
        stack.create_pods(control_ports={"counter-1": proxy.port})
        start_operator(stack)
        kept = completed_checkpoint(kubectl, stack, "kept")
        dropped_doc = checkpoint_doc("dropped", prepareTimeoutSeconds=10, deletionPolicy="Delete")
        apply(kubectl, dropped_doc)
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/dropped", "--timeout=60s", timeout=70)
        dropped = get(kubectl, "checkpoint", "dropped")["status"]

        kubectl("delete", "checkpoint", "kept", timeout=60)
        assert stored_objects(seaweed, location, kept["checkpointId"]), "Retain removed the data"
        assert "DataDeleted" not in reasons_of(kubectl, "kept")

        stack.kill()
        stack.start()
        proxy.hold.set()
        apply(
            kubectl,
            {
                "apiVersion": "gym-checkpoint.dev/v1alpha1",
                "kind": "Restore",
                "metadata": {"name": "reader"},
                "spec": {"checkpointRef": {"name": "dropped"}},
            },
        )
        wait_for(proxy.withheld.is_set, timeout=60, what="the restore to be under way")
        kubectl("delete", "checkpoint", "dropped", "--wait=false")
        wait_for(lambda: "WaitingForRestore" in reasons_of(kubectl, "dropped"), timeout=30, what="the deletion to wait")
        # kopf retries the deletion every 2 s while the Restore runs: one Event says so, not one per retry
        wait_for(
            lambda: (tmp_path / "operator.log").read_text().count("while Restore reader reads it") >= 3,
            timeout=60,
            what="the deletion to be retried",
        )
        assert reasons_of(kubectl, "dropped").count("WaitingForRestore") == 1
        assert get(kubectl, "checkpoint", "dropped")["metadata"]["deletionTimestamp"]
        assert stored_objects(seaweed, location, dropped["checkpointId"])
        proxy.hold.clear()
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "restore/reader", "--timeout=60s", timeout=70)
        wait_for(
            lambda: kubectl("get", "checkpoint", "dropped", check=False).returncode != 0,
            timeout=30,
            what="the Checkpoint to go once the Restore completed",
        )
        assert not stored_objects(seaweed, location, dropped["checkpointId"])
        assert "DataDeleted" in reasons_of(kubectl, "dropped")
    finally:
        proxy.stop()
        stack.kill()


def test_ttl_deletes_the_checkpoint_and_with_the_delete_policy_its_data(
    operator_env, kubectl, seaweed, tmp_path
) -> None:
    """`spec.ttl` like Velero's: `status.expiration` is creation + ttl; then the operator deletes the Checkpoint,
    and `deletionPolicy: Delete` removes its stored objects."""
    import datetime as dt

    start_operator, location = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})
    stack.start()
    stack.create_pods()
    start_operator(stack)
    try:
        apply(kubectl, checkpoint_doc("brief", prepareTimeoutSeconds=10, ttl="8s", deletionPolicy="Delete"))
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/brief", "--timeout=60s", timeout=70)
        doc = wait_for(
            lambda: (d := get(kubectl, "checkpoint", "brief"))["status"].get("expiration") and d,
            what="status.expiration",
        )
        created = dt.datetime.fromisoformat(doc["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        assert doc["status"]["expiration"] == (created + dt.timedelta(seconds=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
        checkpoint_id = doc["status"]["checkpointId"]
        assert stored_objects(seaweed, location, checkpoint_id)
        wait_for(
            lambda: kubectl("get", "checkpoint", "brief", check=False).returncode != 0,
            timeout=40,
            what="the expired Checkpoint to be deleted",
        )
        assert dt.datetime.now(dt.UTC) >= created + dt.timedelta(seconds=8)
        assert not stored_objects(seaweed, location, checkpoint_id)
        assert {"Expired", "DataDeleted"} <= set(reasons_of(kubectl, "brief"))
    finally:
        stack.kill()


def test_a_checkpoint_expires_only_once_its_transaction_has_ended(operator_env, kubectl, tmp_path) -> None:
    """`spec.ttl` shorter than the transaction: the Checkpoint is not deleted mid-transaction (which would cancel it,
    reason Deleted). Its transaction ends by itself first (Failed, reason Blocked: a live session holds the stack for
    the 3 s prepare deadline), and then it expires."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "restart_only"})
    stack.start()
    stack.create_pods()
    start_operator(stack)
    try:
        with httpx.Client(base_url=stack.url("counter-0")) as http:
            http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": "live"})
        apply(kubectl, checkpoint_doc("short", prepareTimeoutSeconds=3, leaseSeconds=60, ttl="1s"))
        wait_for(lambda: gone(kubectl, "checkpoint", "short"), timeout=40, what="the expired Checkpoint to be deleted")
        wait_for(lambda: "Expired" in reasons_of(kubectl, "short"), what="the Expired Event")
        reasons = reasons_of(kubectl, "short")
        assert "Blocked" in reasons and "Deleted" not in reasons, reasons
        assert admission_is_open(stack)
    finally:
        stack.kill()


def watch_events(kemu: Any, path: str, since: str, until_deleted: str) -> tuple[threading.Thread, list[dict]]:
    """Collect the watch events of `path` from `since` until `until_deleted` is DELETED (bounded by 120 s)."""
    seen: list[dict] = []

    def run() -> None:
        with (
            kemu.client(timeout=httpx.Timeout(10, read=130)) as api,
            api.stream("GET", path, params={"watch": "true", "resourceVersion": since, "timeoutSeconds": "120"}) as s,
        ):
            for line in s.iter_lines():
                event = json.loads(line)
                seen.append(event)
                if event["type"] == "DELETED" and event["object"]["metadata"]["name"] == until_deleted:
                    return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, seen


def test_a_deleted_checkpoint_whose_storage_is_gone_goes_after_bounded_tries(
    operators: Operators, kemu: Any, kubectl: Any, namespace: str
) -> None:
    """`deletionPolicy: Delete` and storage that never answers: the operator tries GYMCKPT_DELETE_ATTEMPTS times
    (delays doubling), says so with the DataDeleted=False condition and one DeleteFailed Warning, then keeps the data,
    posts one DataKept Warning and lets the Checkpoint go. Before, it retried for ever and the Checkpoint stayed."""
    operators.start(namespace, GYMCKPT_DELETE_ATTEMPTS="3", GYMCKPT_DELETE_RETRY_SECONDS="1")
    completed_earlier(kubectl, namespace, "unreachable", deletionPolicy="Delete")
    wait_for(lambda: finalized(kubectl, namespace, "checkpoint", "unreachable"), what="the finalizer")
    since = json.loads(kubectl("get", "checkpoint", "unreachable", "-o", "json").stdout)["metadata"]["resourceVersion"]
    path = f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/checkpoints"
    thread, seen = watch_events(kemu, path, since, "unreachable")
    kubectl("delete", "checkpoint", "unreachable", "--timeout=60s", timeout=70)
    thread.join(timeout=60)
    conditions = [
        c
        for event in seen
        for c in (event["object"].get("status") or {}).get("conditions") or []
        if c["type"] == "DataDeleted"
    ]
    assert conditions and conditions[0]["status"] == "False" and conditions[0]["reason"] == "DeleteFailed"
    assert conditions[-1]["reason"] == "DataKept" and "unreachable-0000abcd" in conditions[-1]["message"]
    events = json.loads(kubectl("get", "events", "-o", "json").stdout)["items"]
    reasons = [e["reason"] for e in events if e["involvedObject"]["name"] == "unreachable"]
    assert reasons.count("DataKept") == 1 and reasons.count("DeleteFailed") == 1, reasons
    assert operators.log.read_text().count("try 3 of 3") == 0  # the third failure gives up, not retries
    assert operators.log.read_text().count("(try 2 of 3)") >= 1
