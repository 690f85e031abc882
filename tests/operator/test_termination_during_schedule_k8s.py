"""A pod terminates while a scheduled checkpoint is running, forced rather than raced: one server of the stack is
frozen (SIGSTOP) before the schedule's run, so that run waits in prepare when the pod is marked for preemption. The
termination Checkpoint is created at once but waits (``Pending``) until the scheduled one has ended, never runs beside
it, and then takes the stack's final checkpoint."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import httpx
import pytest
from tests.operator.harness import Stack, apply, checkpoints, get, resource, status_of, wait_for

pytestmark = pytest.mark.k8s

ON = {"GYMCKPT_TERMINATION_CHECKPOINT": "enabled", "GYMCKPT_AUTO_RESTORE": "enabled"}
CREATED_BY = "gym-checkpoint.dev/created-by"
#: the phases of a transaction that holds the stack
ACTIVE = ("Preparing", "Capturing", "Persisting", "Publishing", "Resuming", "Aborting")


def phase_of(checkpoint: dict[str, Any]) -> str:
    return str((checkpoint.get("status") or {}).get("phase") or "")


def test_a_preemption_during_a_running_scheduled_checkpoint_waits_for_it_then_takes_the_final_one(
    operator_env, kubectl, namespace, tmp_path
) -> None:
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"a-0": "exported", "b-0": "exported"})
    stack.start()
    stack.create_pods()
    for name in ("a-0", "b-0"):
        with httpx.Client(base_url=stack.url(name)) as http:
            http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": f"r-{name}"}).raise_for_status()
    start_operator(stack, **ON)
    frozen = next(server.pid for server in stack.state.servers if server.name == "b-0")
    os.kill(frozen, signal.SIGSTOP)  # b-0 answers no prepare until it is thawed
    try:
        # (a prepare timeout shorter than the interval: a schedule refuses a longer one)
        schedule = resource("CheckpointSchedule", "often", keep=3, template={"prepareTimeoutSeconds": 15})
        apply(kubectl, {**schedule, "spec": {**schedule["spec"], "schedule": "@every 20s"}})

        def preparing() -> list[str]:
            return [n for n, c in checkpoints(kubectl, f"{CREATED_BY}=schedule").items() if phase_of(c) == "Preparing"]

        (scheduled,) = wait_for(preparing, 50, "the scheduled checkpoint to wait in prepare")
        disruption = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        kubectl(
            "patch", "pod", "a-0", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"conditions": [disruption]}}),
        )  # fmt: skip
        (termination,) = wait_for(
            lambda: list(checkpoints(kubectl, f"{CREATED_BY}=termination")), 20, "the termination Checkpoint"
        )
        # never two at once: while the scheduled one prepares, the termination one waits
        until = time.monotonic() + 2
        while time.monotonic() < until:
            assert phase_of(get(kubectl, "checkpoint", termination)) in ("", "Pending")
            assert phase_of(get(kubectl, "checkpoint", scheduled)) == "Preparing"
            time.sleep(0.3)
    finally:
        os.kill(frozen, signal.SIGCONT)
    # thawed: the scheduled one ends, then the termination one runs; one listing is one moment of both
    deadline, seen = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        both = checkpoints(kubectl, CREATED_BY)
        now = (phase_of(both[scheduled]), phase_of(both[termination]))
        seen.append(now)
        assert not (now[0] in ACTIVE and now[1] in ACTIVE), seen
        if now[1] in ("Completed", "Failed"):
            break
        time.sleep(0.1)
    regular, final = get(kubectl, "checkpoint", scheduled)["status"], get(kubectl, "checkpoint", termination)["status"]
    assert regular["phase"] == "Completed" and not regular.get("final"), regular
    assert final["phase"] == "Completed" and final["final"] is True, final
    assert final["completionTime"] >= regular["completionTime"]
    assert sorted(p["id"] for p in final["participants"]) == ["a-0", "b-0"]  # the whole stack, one transaction
    assert {status_of(stack, name)["phase"] for name in ("a-0", "b-0")} == {"final"}
