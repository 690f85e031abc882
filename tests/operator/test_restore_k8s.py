"""A Restore's transaction (gym_operator.controllers.restore) with the real kopf operator on the emulator: a stack
checkpointed, killed and restored continues at attempt + 1; a Restore reads the storage location it names, waits while
the stack rolls out, and is carried through to the end by a new operator when the first dies between two resumes."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import httpx
import pytest
from tests.operator.harness import (
    RELEASE,
    Stack,
    WithholdingProxy,
    apply,
    checkpoint_doc,
    completed_checkpoint,
    get,
    own_by_statefulset,
    phase,
    reasons_of,
    restore_of,
    settle_statefulset,
    status_of,
    wait_for,
)

pytestmark = pytest.mark.k8s


@pytest.fixture
def kemu(kemu_shared: Any) -> Any:
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


def test_checkpoint_kill_restore_continue(operator_env, kubectl, tmp_path, seaweed) -> None:
    start_operator, location = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported", "counter-1": "exported"})
    stack.start()
    stack.create_pods()
    start_operator(stack)
    # one live session per server, each a rollout at attempt 0
    cookies = {}
    for i, name in enumerate(stack.modes):
        with httpx.Client(base_url=stack.url(name)) as http:
            ident = {"x-ng-rollout-id": f"r{i}", "x-ng-attempt": "0"}
            http.post("/seed_session", json={"start": 10 * i}, headers=ident)
            assert http.post("/increment", json={"by": 5}, headers=ident).json() == {"output": 10 * i + 5}
            cookies[name] = dict(http.cookies)

    apply(kubectl, checkpoint_doc("ck1", prepareTimeoutSeconds=10, leaseSeconds=30))
    kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/ck1", "--timeout=60s", timeout=70)
    status = get(kubectl, "checkpoint", "ck1")["status"]
    assert status["participantCount"] == 2  # status.records: see test_status_records_are_in_the_schema (xfail)
    assert status["location"] == location and status["checkpointId"].startswith("ck1-")
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Progressing": "False",
        "Completed": "True",
        "Failed": "False",
    }
    assert status["pauseSeconds"] > 0 and {"prepare", "capture", "resume", "persist", "publish"} <= set(
        status["timings"]
    )
    assert status["method"] == "background" and status["publishedSeconds"] >= status["pauseSeconds"]
    table = kubectl("get", "checkpoints").stdout
    assert "PHASE" in table and "Completed" in table.splitlines()[1]
    bucket, prefix = location[len("s3://") :].split("/", 1)
    keys = [o["Key"] for o in seaweed.client().list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    assert sum("/packs/" in k for k in keys) == 2 and any(
        k.endswith(f"{status['checkpointId']}/manifest.json") for k in keys
    )
    events = kubectl("get", "events", "-o", "json").stdout
    assert "Preparing" in events and "Completed" in events

    # crash: every server process dies; fresh ones start on the same pods (same names and ports)
    stack.kill()
    stack.start()
    apply(
        kubectl,
        {
            "apiVersion": "gym-checkpoint.dev/v1alpha1",
            "kind": "Restore",
            "metadata": {"name": "rs1"},
            "spec": {"checkpointRef": {"name": "ck1"}},
        },
    )
    kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "restore/rs1", "--timeout=60s", timeout=70)
    restore_doc = get(kubectl, "restore", "rs1")
    restored = restore_doc["status"]
    assert restored["attempt"] == 1 and restored["restoredEpisodes"] == 2
    # the resource's uid names the restore, so a restarted operator repeats the same transaction
    assert restored["restoreId"] == restore_doc["metadata"]["uid"]
    decision_key = f"{prefix}/checkpoints/{status['checkpointId']}/restores/{restored['restoreId']}.json"
    decision = json.loads(seaweed.client().get_object(Bucket=bucket, Key=decision_key)["Body"].read())
    assert decision["decision"] == "resume" and decision["decided_by"] == "coordinator"
    assert "Completed" in kubectl("get", "restores").stdout
    for i, name in enumerate(stack.modes):
        with httpx.Client(base_url=stack.url(name), cookies=cookies[name]) as http:
            old = http.post("/increment", json={"by": 1}, headers={"x-ng-rollout-id": f"r{i}", "x-ng-attempt": "0"})
            assert old.status_code == 409 and old.json()["error"]["code"] == "stale_attempt"
            ident = {"x-ng-rollout-id": f"r{i}", "x-ng-attempt": "1"}
            assert http.post("/increment", json={"by": 1}, headers=ident).json() == {"output": 10 * i + 6}
            assert http.post("/verify", json={"target": 10 * i + 6}, headers=ident).json()["reward"] == 1.0
    stack.kill()


def test_restore_by_checkpoint_id_reads_the_named_storage_location(operator_env, kubectl, tmp_path) -> None:
    """A Restore naming `spec.storageLocation` and `spec.checkpointId` reads that location. The
    checkpoint exists only at the default location, so a Restore naming another one must not complete from the
    default; a location the admin has not defined is refused, saying how to list the ones there are."""
    start_operator, location = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})
    stack.start()
    stack.create_pods()
    elsewhere = f"{location.rstrip('/')}-elsewhere"
    bucket, prefix = elsewhere[len("s3://") :].split("/", 1)
    located = {"release": RELEASE, "bucket": bucket, "prefix": prefix, "validationFrequency": "0s"}
    doc = {"kind": "CheckpointStorageLocation", "metadata": {"name": "elsewhere"}, "spec": located}
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "gym-checkpoint.dev/v1alpha1", **doc}))
    start_operator(stack)
    try:
        status = completed_checkpoint(kubectl, stack, "source")
        for name, named in (("by-loc", "elsewhere"), ("nowhere", "nowhere")):
            apply(
                kubectl,
                {
                    "apiVersion": "gym-checkpoint.dev/v1alpha1",
                    "kind": "Restore",
                    "metadata": {"name": name},
                    "spec": {"storageLocation": named, "checkpointId": status["checkpointId"]},
                },
            )
        wait_for(lambda: phase(kubectl, "restore", "by-loc") in ("Completed", "Failed"), timeout=60, what="an outcome")
        restored = get(kubectl, "restore", "by-loc")["status"]
        assert restored["location"] == elsewhere
        assert restored["phase"] == "Failed"
        kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "restore/nowhere", "--timeout=60s", timeout=70)
        nowhere = get(kubectl, "restore", "nowhere")["status"]
        assert nowhere["reason"] == "UnknownStorageLocation" and "checkpointstoragelocations" in nowhere["message"]
    finally:
        stack.kill()


def test_a_restore_waits_while_the_stacks_statefulset_rolls_out_and_runs_on_the_new_pods_only(
    operator_env, kubectl, tmp_path
) -> None:
    """After `helm upgrade` a StatefulSet replaces its pods one at a time. A Restore made meanwhile waits in Pending
    (reason WaitingForRollout, an Event naming the StatefulSet) instead of failing or restoring into a pod about to
    be replaced, and runs once every pod is at the update revision (Event Settled). A rollout that never settles
    fails the Restore after the operator's rollout patience (reason StackRolling). On ce41d67 discovery never
    looked at the StatefulSet: the Restore ran at once, into the old-revision pod."""
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported", "counter-1": "exported"})
    stack.start()
    stack.create_pods()
    for pod in stack.modes:
        own_by_statefulset(kubectl, pod, "counter", replicas=2)
        kubectl("label", "pod", pod, "controller-revision-hash=rev-1", "--overwrite")
    operator = start_operator(stack)
    try:
        apply(kubectl, checkpoint_doc("before-upgrade", prepareTimeoutSeconds=10))
        kubectl(
            "wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/before-upgrade", "--timeout=60s", timeout=70
        )

        # the upgrade: counter-1 is replaced first (new revision), counter-0 still runs the old one
        stack.kill()
        stack.start()
        kubectl("label", "pod", "counter-1", "controller-revision-hash=rev-2", "--overwrite")
        settle_statefulset(kubectl, "counter", 2, "rev-2", updated=1, current="rev-1")
        apply(kubectl, restore_of("after-upgrade", "before-upgrade"))
        wait_for(lambda: phase(kubectl, "restore", "after-upgrade") == "Pending", what="the Restore to wait")
        waiting = get(kubectl, "restore", "after-upgrade")["status"]
        assert waiting["reason"] == "WaitingForRollout"
        assert "StatefulSet counter: rolling out revision rev-2, 1 of 2 pods updated" in waiting["message"]
        progressing = next(c for c in waiting["conditions"] if c["type"] == "Progressing")
        assert (progressing["status"], progressing["reason"]) == ("False", "WaitingForRollout")
        wait_for(lambda: "Waiting" in reasons_of(kubectl, "after-upgrade"), what="the Waiting Event")
        assert [status_of(stack, name)["checkpoint_id"] for name in stack.modes] == [None, None]  # none was called

        kubectl("label", "pod", "counter-0", "controller-revision-hash=rev-2", "--overwrite")
        settle_statefulset(kubectl, "counter", 2, "rev-2")  # the rollout is done
        kubectl(
            "wait", "--for=jsonpath={.status.phase}=Completed", "restore/after-upgrade", "--timeout=60s", timeout=70
        )
        restored = get(kubectl, "restore", "after-upgrade")["status"]
        assert restored["participantCount"] == 2 and restored["replicas"] == {"counter": 2}
        assert "Settled" in reasons_of(kubectl, "after-upgrade")

        # a rollout that never finishes: the Restore gives up after the operator's patience
        os.killpg(operator.pid, signal.SIGTERM)
        operator.wait(timeout=30)
        start_operator(stack, GYMCKPT_ROLLOUT_PATIENCE_SECONDS="3")
        kubectl("label", "pod", "counter-1", "controller-revision-hash=rev-3", "--overwrite")
        settle_statefulset(kubectl, "counter", 2, "rev-3", updated=1, current="rev-2")
        apply(kubectl, restore_of("stuck", "before-upgrade"))
        kubectl("wait", "--for=jsonpath={.status.phase}=Failed", "restore/stuck", "--timeout=60s", timeout=70)
        stuck = get(kubectl, "restore", "stuck")["status"]
        assert stuck["reason"] == "StackRolling" and "did not settle in 3s" in stuck["message"]
        assert "rolling out revision rev-3" in stuck["message"]
    finally:
        stack.kill()


def test_operator_killed_between_two_resumes_of_a_restore_leaves_it_installed_everywhere(
    operator_env, kubectl, tmp_path
) -> None:
    """The operator has written the Restore's decision and resumed two of three servers when it is SIGKILLed (a
    proxy withholds the third resume). The third server's lease runs out, it reads the decision and resumes too; a
    new operator repeats the same restore id, installs nothing twice, and ends the Restore as Completed."""
    start_operator, _location = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported", "counter-1": "exported", "counter-2": "exported"})
    stack.start()
    proxy = WithholdingProxy(stack.url("counter-2"))
    try:
        stack.create_pods(control_ports={"counter-2": proxy.port})
        operator = start_operator(stack)
        cookies = {}
        for i, name in enumerate(stack.modes):
            with httpx.Client(base_url=stack.url(name)) as http:
                http.post(
                    "/seed_session", json={"start": 10 * i}, headers={"x-ng-rollout-id": f"r{i}"}
                ).raise_for_status()
                cookies[name] = dict(http.cookies)

        def bump_all() -> list[int]:
            outputs = []
            for i, name in enumerate(stack.modes):
                with httpx.Client(base_url=stack.url(name), cookies=cookies[name]) as http:
                    reply = http.post(
                        "/increment", json={"by": 1}, headers={"x-ng-rollout-id": f"r{i}", "x-ng-attempt": "1"}
                    )
                    outputs.append(reply.json()["output"])
            return outputs

        def statuses() -> dict[str, dict]:
            return {
                name: httpx.get(
                    f"{stack.url(name)}/ng-control/v1/checkpoint/status",
                    headers={"authorization": f"Bearer {stack.token}"},
                ).json()
                for name in stack.modes
            }

        apply(kubectl, checkpoint_doc("ck-d", prepareTimeoutSeconds=10))
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/ck-d", "--timeout=60s", timeout=70)
        stack.kill()
        stack.start()

        proxy.hold.set()
        apply(
            kubectl,
            {
                "apiVersion": "gym-checkpoint.dev/v1alpha1",
                "kind": "Restore",
                "metadata": {"name": "rs-d"},
                "spec": {"checkpointRef": {"name": "ck-d"}, "leaseSeconds": 5},
            },
        )
        wait_for(proxy.withheld.is_set, timeout=60, what="the operator to resume counter-2")
        wait_for(
            lambda: [n for n, st in statuses().items() if st["admission_open"]] == ["counter-0", "counter-1"],
            what="the other two servers to be resumed",
        )
        os.killpg(operator.pid, signal.SIGKILL)
        operator.wait(timeout=10)
        proxy.hold.clear()
        assert get(kubectl, "restore", "rs-d")["status"]["phase"] == "Resuming"
        assert statuses()["counter-2"]["phase"] == "restored"

        wait_for(
            lambda: all(st["admission_open"] for st in statuses().values()),
            timeout=30,
            what="counter-2's lease to run out and follow the decision",
        )
        assert all(st["phase"] == "open" and st["live"] == {"sessions": 1} for st in statuses().values()), statuses()
        assert "resumed as decided" in statuses()["counter-2"]["last_event"]
        assert bump_all() == [1, 11, 21]  # the restored sessions serve their next attempt

        start_operator(stack)  # a new operator repeats the same restore id
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "restore/rs-d", "--timeout=60s", timeout=70)
        restore_doc = get(kubectl, "restore", "rs-d")
        assert restore_doc["status"]["restoreId"] == restore_doc["metadata"]["uid"]
        assert restore_doc["status"]["restoredEpisodes"] == 3 and restore_doc["status"]["attempt"] == 1
        assert bump_all() == [2, 12, 22]  # repeating the restore installed nothing a second time
    finally:
        proxy.stop()
        stack.kill()
