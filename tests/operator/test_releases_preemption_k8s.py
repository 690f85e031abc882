"""Two releases in one namespace, each with its operator (termination checkpoints and autoRestore on, as the chart
runs it): their CheckpointSchedules and their preemptions never touch each other. Each schedule runs, stamps out and
prunes only its own release's Checkpoints (a Checkpoint of the other release carrying its label stays); a pod of one
release terminating (the DisruptionTarget condition the eviction API and the scheduler set before deleting it) starts
a final Checkpoint of that release's stack only, and the other release's servers never pause."""

from __future__ import annotations

import json

import httpx
import pytest
from tests.operator.harness import (
    Stack,
    apply,
    checkpoints,
    completed_earlier,
    get,
    gone,
    resource,
    status_of,
    wait_for,
)

pytestmark = pytest.mark.k8s

SCHEDULE = "gym-checkpoint.dev/schedule"
ON = {"GYMCKPT_TERMINATION_CHECKPOINT": "enabled", "GYMCKPT_AUTO_RESTORE": "enabled"}


def test_two_releases_schedules_and_preemptions_never_touch_each_other(
    operator_env, kubectl, namespace, tmp_path
) -> None:
    start_operator, _ = operator_env
    # runs of an earlier install, labelled as alpha's schedule: one of alpha (pruned by it), one of beta (never
    # alpha's to prune); older than these stacks, so neither is what their fresh servers resume from
    for name, release in (("old-alpha", "alpha"), ("old-beta", "beta")):
        completed_earlier(kubectl, namespace, name, release=release)
        kubectl("label", "checkpoint", name, f"{SCHEDULE}=alpha-nightly")
    stacks = {}
    for release in ("alpha", "beta"):
        (tmp_path / release).mkdir()
        stacks[release] = Stack(tmp_path / release, kubectl, {f"{release}-0": "exported"}, release=release)
        stacks[release].start()
        stacks[release].create_pods()
        with httpx.Client(base_url=stacks[release].url(f"{release}-0")) as http:
            http.post("/seed_session", json={"start": 3}, headers={"x-ng-rollout-id": "r"}).raise_for_status()
    for release, stack in stacks.items():
        start_operator(stack, log_name=f"operator-{release}.log", GYMCKPT_RELEASE=release, **ON)
    for release in stacks:
        template = {"prepareTimeoutSeconds": 5}
        schedule = resource("CheckpointSchedule", f"{release}-nightly", release=release, keep=1, template=template)
        apply(kubectl, {**schedule, "spec": {**schedule["spec"], "schedule": "@every 10s"}})
    for release in stacks:
        ran = wait_for(
            lambda r=release: (
                get(kubectl, "checkpointschedule", f"{r}-nightly").get("status", {}).get("lastSuccessfulCheckpoint")
            ),
            45,
            f"{release}'s first run",
        )
        checkpoint = get(kubectl, "checkpoint", ran)
        assert checkpoint["spec"]["release"] == release
        assert [p["id"] for p in checkpoint["status"]["participants"]] == [f"{release}-0"]
    wait_for(lambda: gone(kubectl, "checkpoint", "old-alpha"), 20, "alpha's schedule to prune its own")
    assert not gone(kubectl, "checkpoint", "old-beta")

    # alpha's pod is about to be preempted: alpha's stack alone takes a final checkpoint
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    kubectl(
        "patch", "pod", "alpha-0", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"conditions": [disruption]}}),
    )  # fmt: skip
    final = wait_for(
        lambda: checkpoints(kubectl, "gym-checkpoint.dev/created-by=termination"), 30, "the termination checkpoint"
    )
    (name,) = final
    kubectl("wait", "--for=jsonpath={.status.phase}=Completed", f"checkpoint/{name}", "--timeout=60s", timeout=70)
    taken = get(kubectl, "checkpoint", name)
    assert name.startswith("alpha-termination-") and taken["spec"]["release"] == "alpha" and taken["spec"]["final"]
    assert [p["id"] for p in taken["status"]["participants"]] == ["alpha-0"]
    assert status_of(stacks["alpha"], "alpha-0")["phase"] == "final"
    beta = status_of(stacks["beta"], "beta-0")
    assert beta["phase"] == "open" and beta["admission_open"]
    events = json.loads(kubectl("get", "events", "-o", "json").stdout)["items"]
    on_pods = {(e["involvedObject"]["name"], e["reason"]) for e in events if e["involvedObject"]["kind"] == "Pod"}
    assert on_pods == {("alpha-0", "TerminationCheckpoint")}
    # nothing of beta was started, pruned or restored by alpha's operator, nor the other way round
    assert all(c["spec"]["release"] == "beta" for c in checkpoints(kubectl, f"{SCHEDULE}=beta-nightly").values())
    # and the fresh new stacks were not restored from the earlier install's checkpoints
    restores = json.loads(kubectl("get", "restores", "-o", "json").stdout)["items"]
    assert [r["metadata"]["name"] for r in restores] == [], (tmp_path / "operator-alpha.log").read_text()[-4000:]
    for stack in stacks.values():
        stack.kill()
