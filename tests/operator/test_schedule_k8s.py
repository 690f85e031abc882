"""CheckpointSchedules (gym_operator.controllers.schedule) with the real kopf operator on the emulator: a schedule
skips a run while another Checkpoint of its release is in flight, creates its Checkpoint from its template, keeps the
newest `keep` (never one an unfinished Restore reads) and says all of it in its status and Events; bad input is
refused by the API server (the CRD's rules) or gets phase FailedValidation, and the operator goes on."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import yaml
from tests.operator.harness import (
    RELEASE,
    Stack,
    apply,
    checkpoint_doc,
    completed_earlier,
    get,
    gone,
    install_crds,
    reasons_of,
    resource,
    wait_for,
)

pytestmark = pytest.mark.k8s

SCHEDULE = "gym-checkpoint.dev/schedule"


@pytest.fixture
def kemu(kemu_shared: Any) -> Any:
    """This file's tests share one emulator, each in its own namespace."""
    return kemu_shared


def schedule_status(kubectl: Any, name: str) -> dict[str, Any]:
    return dict(get(kubectl, "checkpointschedule", name).get("status") or {})


def earlier(kubectl: Any, namespace: str, name: str, schedule: str, failed: bool = False, **spec: Any) -> None:
    """A Checkpoint the schedule made before (completed, or failed), labelled as its runs are."""
    completed_earlier(kubectl, namespace, name, **spec)
    kubectl("label", "checkpoint", name, f"{SCHEDULE}={schedule}", "gym-checkpoint.dev/created-by=schedule")
    if failed:
        status = {"phase": "Failed", "reason": "TransactionFailed", "message": "failed earlier"}
        kubectl(
            "patch", "checkpoint", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status})
        )


def test_a_schedule_skips_while_one_is_in_flight_then_creates_and_keeps_the_newest(
    operator_env, kubectl, namespace, tmp_path
) -> None:
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"fast-0": "exported", "slow-0": "restart_only"})
    stack.start()
    stack.create_pods(labels={"fast-0": {"tier": "fast"}, "slow-0": {"tier": "slow"}})
    # what an earlier operator left of this schedule: two completed runs and a failed one (that a Restore which has
    # not ended keeps what it reads: tests/operator/test_preemption_rules.py)
    earlier(kubectl, namespace, "nightly-1", "nightly")
    earlier(kubectl, namespace, "nightly-2", "nightly")
    earlier(kubectl, namespace, "nightly-3", "nightly", failed=True)
    start_operator(stack)
    for name in stack.modes:
        with httpx.Client(base_url=stack.url(name)) as http:
            http.post("/seed_session", json={"start": 1}, headers={"x-ng-rollout-id": name}).raise_for_status()

    # a Checkpoint of the release in flight (blocked by the restart_only server's live session for 14 s) ...
    apply(kubectl, checkpoint_doc("slow", prepareTimeoutSeconds=14, selector={"matchLabels": {"tier": "slow"}}))
    wait_for(lambda: get(kubectl, "checkpoint", "slow").get("status", {}).get("phase") == "Preparing", what="slow")
    # ... when the schedule's first run comes (10 s after its creation): skipped; the next one runs
    template = {"prepareTimeoutSeconds": 5, "selector": {"matchLabels": {"tier": "fast"}}, "ttl": "720h"}
    apply(kubectl, resource("CheckpointSchedule", "nightly", schedule="@every 10s", keep=1, template=template))
    skipped = wait_for(lambda: schedule_status(kubectl, "nightly").get("lastSkipped"), 30, "a skipped run")
    created = wait_for(lambda: schedule_status(kubectl, "nightly").get("lastCheckpoint"), 40, "a run")
    kubectl("wait", "--for=jsonpath={.status.phase}=Completed", f"checkpoint/{created}", "--timeout=60s", timeout=70)
    checkpoint = get(kubectl, "checkpoint", created)
    assert checkpoint["metadata"]["labels"] == {
        SCHEDULE: "nightly",
        "gym-checkpoint.dev/created-by": "schedule",
        "velero.io/exclude-from-backup": "true",  # (never backed up and replayed by a Velero restore)
    }
    assert checkpoint["spec"]["release"] == RELEASE and checkpoint["spec"]["ttl"] == "720h"
    assert checkpoint["status"]["participants"][0]["id"] == "fast-0"  # the template's selector
    assert get(kubectl, "checkpoint", "slow")["status"]["phase"] == "Failed"  # (ended before the run)

    # keep 1: the older completed ones and the failed one go; a Checkpoint of the release it did not make stays
    wait_for(lambda: all(gone(kubectl, "checkpoint", f"nightly-{n}") for n in (1, 2, 3)), 30, "pruning")
    assert not gone(kubectl, "checkpoint", "slow") and not gone(kubectl, "checkpoint", created)
    status = wait_for(
        lambda: (s := schedule_status(kubectl, "nightly")).get("lastSuccessfulCheckpoint") == created and s,
        20,
        "the status",
    )
    assert status["phase"] == "Enabled" and status["lastScheduleTime"] > skipped
    assert status["nextScheduleTime"] > status["lastScheduleTime"]
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {"Ready": ("True", "Enabled"), "IntervalFits": ("True", "Fits")}
    reasons = reasons_of(kubectl, "nightly")
    assert {"Skipped", "Scheduled", "Pruned"} <= set(reasons), reasons
    messages = [e["message"] for e in json.loads(kubectl("get", "events", "-o", "json").stdout)["items"]]
    assert any("Checkpoint slow of the release is in flight" in m for m in messages)

    # its next run: now its own first one is beyond keep, and goes
    following = wait_for(
        lambda: (s := schedule_status(kubectl, "nightly").get("lastSuccessfulCheckpoint")) not in (None, created) and s,
        40,
        "the next run",
    )
    wait_for(lambda: gone(kubectl, "checkpoint", created), 30, "the first run pruned")
    assert not gone(kubectl, "checkpoint", following) and not gone(kubectl, "checkpoint", "slow")
    stack.kill()


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"schedule": "@every 1m", "keep": 0}, "spec.keep: Invalid value: 0"),
        ({"schedule": "@every 5s"}, "@every must be at least 10s"),
        ({"schedule": "* * * *"}, "a cron expression has 5 fields"),
        ({"schedule": "@every ten"}, "@every takes a duration"),
        ({"schedule": "@every 1m", "release": "Not A Release"}, "spec.release"),
        ({"keep": 3}, "spec.schedule: Required value"),
    ],
)
def test_the_api_server_refuses_a_schedule_that_cannot_be(
    kemu, kubectl, namespace, spec: dict[str, Any], says: str
) -> None:
    install_crds(kemu, kubectl)
    body = {
        "apiVersion": "gym-checkpoint.dev/v1alpha1",
        "kind": "CheckpointSchedule",
        "metadata": {"name": "bad"},
        "spec": {"release": RELEASE, **spec},
    }
    refused = kubectl("apply", "-f", "-", input=yaml.safe_dump(body), check=False)
    assert refused.returncode != 0 and says in refused.stderr, refused.stderr
    assert gone(kubectl, "checkpointschedule", "bad")


def test_a_schedule_the_operator_cannot_run_fails_validation_and_a_fixed_one_runs(
    operator_env, kubectl, tmp_path
) -> None:
    start_operator, _ = operator_env
    stack = Stack(tmp_path, kubectl, {"counter-0": "exported"})
    stack.start()
    stack.create_pods()
    operator = start_operator(stack)
    # five fields, but no minute 61; an interval the template's prepare timeout (30 s by default) does not fit
    apply(kubectl, resource("CheckpointSchedule", "odd", schedule="61 * * * *"))
    apply(kubectl, resource("CheckpointSchedule", "tight", schedule="@every 10s"))
    for name, says in (("odd", "minute 61: out of range 0-59"), ("tight", "not longer than template.prepareTimeout")):
        status = wait_for(
            lambda n=name: (s := schedule_status(kubectl, n)).get("phase") == "FailedValidation" and s, 30, name
        )
        assert says in status["validationErrors"][0], status
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "FailedValidation")
        assert "nextScheduleTime" not in status
        assert reasons_of(kubectl, name) == ["FailedValidation"]
    # fixed: it runs (and the operator never stopped)
    patch = {"spec": {"template": {"prepareTimeoutSeconds": 5}}}
    kubectl("patch", "checkpointschedule", "tight", "--type=merge", "-p", json.dumps(patch))
    created = wait_for(lambda: schedule_status(kubectl, "tight").get("lastCheckpoint"), 40, "a run")
    assert schedule_status(kubectl, "tight")["phase"] == "Enabled" and created.startswith("tight-")
    assert operator.poll() is None
    assert reasons_of(kubectl, "odd") == ["FailedValidation"]  # said once, not again every second
    stack.kill()
