"""The rules of the schedule, the termination checkpoint and the automatic resume, as functions of what the API
holds (no cluster): which Checkpoints a schedule prunes, which checkpoint the stack resumes from, when a pod is
terminating and until when, which termination Checkpoint covers a pod, what a schedule refuses."""

from __future__ import annotations

import asyncio
import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest

from gym_operator.controllers import resume, schedule, termination
from gym_operator.specs import CheckpointSpec, SpecError

UTC = dt.UTC


def obj(name: str, phase: str | None, created: str, completed: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "creationTimestamp": created}
    meta.update(extra.pop("metadata", {}))
    status: dict[str, Any] = {"phase": phase} if phase else {}
    if completed:
        status["completionTime"] = completed
    status.update(extra.pop("status", {}))
    return {"metadata": meta, "spec": {"release": "r", **extra.pop("spec", {})}, "status": status}


def names(objs: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


# --- keep ----------------------------------------------------------------------------------------------------------


def test_prune_keeps_the_newest_completed_and_fewer_failed() -> None:
    ours = [
        obj("s-1", "Completed", "2026-03-01T00:01:00Z"),
        obj("s-2", "Failed", "2026-03-01T00:02:00Z"),  # older than the newest completed: goes
        obj("s-3", "Completed", "2026-03-01T00:03:00Z"),
        obj("s-4", "Completed", "2026-03-01T00:04:00Z"),
        obj("s-5", "Failed", "2026-03-01T00:05:00Z"),  # newer than every completed one: kept (it says what failed)
        obj("s-6", None, "2026-03-01T00:06:00Z"),  # in flight: never
    ]
    assert names(schedule.to_prune(ours, [], keep=2)) == ["s-1", "s-2"]
    assert names(schedule.to_prune(ours, [], keep=1)) == ["s-3", "s-1", "s-2"]


def test_prune_never_deletes_what_an_unfinished_restore_reads() -> None:
    ours = [
        obj("s-1", "Completed", "2026-03-01T00:01:00Z", status={"checkpointId": "s-1-aaaa"}),
        obj("s-2", "Completed", "2026-03-01T00:02:00Z", status={"checkpointId": "s-2-bbbb"}),
        obj("s-3", "Completed", "2026-03-01T00:03:00Z"),
    ]
    by_name = obj("r-1", "Restoring", "2026-03-01T00:04:00Z", spec={"checkpointRef": {"name": "s-1"}})
    by_id = obj("r-2", None, "2026-03-01T00:04:00Z", spec={"checkpointId": "s-2-bbbb"})
    ended = obj("r-3", "Completed", "2026-03-01T00:04:00Z", spec={"checkpointRef": {"name": "s-2"}})
    assert names(schedule.to_prune(ours, [by_name, by_id], keep=1)) == []
    assert names(schedule.to_prune(ours, [by_name, ended], keep=1)) == ["s-2"]


def test_prune_leaves_one_being_deleted_alone() -> None:
    going = obj("s-1", "Completed", "2026-03-01T00:01:00Z", metadata={"deletionTimestamp": "2026-03-01T01:00:00Z"})
    ours = [going, obj("s-2", "Completed", "2026-03-01T00:02:00Z"), obj("s-3", "Completed", "2026-03-01T00:03:00Z")]
    assert names(schedule.to_prune(ours, [], keep=1)) == ["s-2"]


# --- what a schedule refuses -----------------------------------------------------------------------------------------


NOW = dt.datetime(2026, 3, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"schedule": "@every 20s"}, "not longer than template.prepareTimeoutSeconds (30s)"),
        ({"schedule": "@every 20s", "template": {"prepareTimeoutSeconds": 20}}, "every 20s, not longer"),
        ({"schedule": "61 * * * *"}, "minute 61: out of range"),
        ({"schedule": "@every 1m", "keep": 0}, "spec.keep"),
        ({"schedule": "@every 1m", "template": {"release": "other"}}, "spec.template.release"),
        ({"schedule": "@every 1m", "template": {"method": "fast"}}, "spec.method"),
    ],
)
def test_a_schedule_that_cannot_run_is_refused_saying_why(spec: dict[str, Any], says: str) -> None:
    with pytest.raises((SpecError, ValueError), match=says.replace("(", r"\(").replace(")", r"\)")):
        schedule.Plan.of({"release": "r", **spec}, NOW)


def test_a_schedule_stamps_out_its_template() -> None:
    plan = schedule.Plan.of(
        {
            "release": "r",
            "schedule": "@every 10s",
            "keep": 3,
            "template": {"prepareTimeoutSeconds": 5, "method": "sync", "ttl": "1h", "deletionPolicy": "Delete"},
        },
        NOW,
    )
    assert plan.checkpoint == CheckpointSpec.parse(
        {"release": "r", "prepareTimeoutSeconds": 5, "method": "sync", "ttl": "1h", "deletionPolicy": "Delete"}
    )
    assert plan.next_run(NOW) == NOW + dt.timedelta(seconds=10) and plan.spec.keep == 3


# --- the checkpoint to resume from ---------------------------------------------------------------------------------


PART = {"matchLabels": {"tier": "a"}}  # a part of the stack: never what the whole stack resumes from


def test_resume_takes_the_newest_completed_checkpoint_of_the_whole_release() -> None:
    checkpoints = [
        obj("c-1", "Completed", "2026-03-01T00:01:00Z", "2026-03-01T00:01:05Z"),
        obj("c-2", "Completed", "2026-03-01T00:02:00Z", "2026-03-01T00:02:05Z"),
        obj("c-3", "Failed", "2026-03-01T00:03:00Z", "2026-03-01T00:03:05Z"),
        obj("c-4", None, "2026-03-01T00:04:00Z"),
        obj("part", "Completed", "2026-03-01T00:05:00Z", "2026-03-01T00:05:05Z", spec={"selector": PART}),
    ]
    assert resume.name_of(resume.candidate(checkpoints, []) or {}) == "c-2"
    # a termination's final checkpoint that completed in the same second as the scheduled one it waited for (whose
    # name sorts after its own) is the newer: nothing runs on the stack after a final checkpoint
    scheduled = obj("often-1", "Completed", "2026-03-01T00:06:00Z", "2026-03-01T00:06:02Z")
    final = obj(
        "gym-termination-1", "Completed", "2026-03-01T00:06:00Z", "2026-03-01T00:06:02Z", status={"final": True}
    )
    assert resume.name_of(resume.candidate([*checkpoints, final, scheduled], []) or {}) == "gym-termination-1"


def test_resume_after_a_restore_takes_only_what_is_newer_or_that_restores_checkpoint_again() -> None:
    checkpoints = [
        obj("c-1", "Completed", "2026-03-01T00:01:00Z", "2026-03-01T00:01:05Z"),
        obj("c-2", "Completed", "2026-03-01T00:02:00Z", "2026-03-01T00:02:05Z"),
    ]
    # someone restored c-1 (rolling back past c-2): a crash after that resumes from c-1, not c-2
    ref = {"checkpointRef": {"name": "c-1"}}
    back = obj("r-1", "Completed", "2026-03-01T00:03:00Z", "2026-03-01T00:03:02Z", spec=ref)
    assert resume.name_of(resume.candidate(checkpoints, [back]) or {}) == "c-1"
    # a checkpoint that completed after (or in the same second as) that restore is newer
    later = obj("c-3", "Completed", "2026-03-01T00:03:02Z", "2026-03-01T00:03:02Z")
    assert resume.name_of(resume.candidate([*checkpoints, later], [back]) or {}) == "c-3"
    # the restored checkpoint is gone: nothing to resume from
    assert resume.candidate(checkpoints[1:], [back]) is None


def test_failed_automatic_restores_are_counted_per_checkpoint() -> None:
    def auto(name: str, phase: str, checkpoint: str) -> dict[str, Any]:
        metadata = {
            "labels": {resume.CREATED_BY_LABEL: resume.AUTO_RESTORE},
            "annotations": {resume.RESUMES_ANNOTATION: checkpoint},
        }
        return obj(name, phase, "2026-03-01T00:00:00Z", metadata=metadata)

    restores = [auto("a", "Failed", "c-1"), auto("b", "Failed", "c-1"), auto("c", "Completed", "c-1")]
    restores += [auto("d", "Failed", "c-2"), obj("e", "Failed", "2026-03-01T00:00:00Z")]  # (e: by hand)
    assert resume.failed_attempts(restores, "c-1") == 2 and resume.failed_attempts(restores, "c-2") == 1


# --- a terminating pod ---------------------------------------------------------------------------------------------


def pod(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"terminationGracePeriodSeconds": 60},
        "status": {"phase": "Running"},
    }
    for key, value in fields.items():
        body[key].update(value)
    return body


def test_a_deleted_pod_runs_until_its_deletion_timestamp() -> None:
    deleted = pod(metadata={"deletionTimestamp": "2026-03-01T00:01:00Z", "deletionGracePeriodSeconds": 60})
    found = termination.termination_of(deleted)
    assert found is not None and found.reason == "Deleted"
    assert (found.started, found.ends) == (
        dt.datetime(2026, 3, 1, tzinfo=UTC),
        dt.datetime(2026, 3, 1, 0, 1, tzinfo=UTC),
    )


def test_a_disruption_target_starts_the_termination_before_the_deletion() -> None:
    condition = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "lastTransitionTime": "2026-03-01T00:00:10Z",
    }
    found = termination.termination_of(pod(status={"conditions": [condition]}))
    assert found is not None and found.reason == "PreemptionByScheduler"
    assert found.ends == dt.datetime(2026, 3, 1, 0, 1, 10, tzinfo=UTC)  # the pod's own 60 s grace
    not_yet = {**condition, "status": "False"}
    assert termination.termination_of(pod(status={"conditions": [not_yet]})) is None
    assert termination.termination_of(pod()) is None
    done = pod(metadata={"deletionTimestamp": "2026-03-01T00:01:00Z"}, status={"phase": "Succeeded"})
    assert termination.termination_of(done) is None


def test_a_termination_is_covered_by_one_in_flight_or_created_after_it_began() -> None:
    began = termination.Termination("p", "u", "Deleted", dt.datetime(2026, 3, 1, 0, 0, 10, 500000, tzinfo=UTC), NOW)
    before = obj("t-1", "Completed", "2026-03-01T00:00:05Z")
    assert termination.covered_by(began, [before]) is None  # an earlier wave's: a new one is needed
    running = obj("t-2", "Preparing", "2026-03-01T00:00:06Z")
    assert termination.covered_by(began, [before, running]) == "t-2"
    same_second = obj("t-3", "Completed", "2026-03-01T00:00:10Z")  # (the API's times are whole seconds)
    assert termination.covered_by(began, [before, same_second]) == "t-3"


def test_a_reinstalled_release_is_never_resumed_from_an_earlier_installs_checkpoint() -> None:
    """Checkpoints survive an uninstall; a reinstall under the same name makes its StatefulSets anew, so its fresh
    participants are new, not preempted: the earlier install's checkpoints are not of this stack. A helm upgrade keeps
    the StatefulSets (only pods are recreated), so its checkpoints stay the stack's."""

    def at(stamp: str) -> dt.datetime:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    def stack(statefulset_created: str, pod_created: str) -> tuple[list[Any], list[Any]]:
        owner = SimpleNamespace(kind="StatefulSet", name="r-model")
        meta = SimpleNamespace(name="r-model-0", owner_references=[owner], creation_timestamp=at(pod_created))
        statefulset = SimpleNamespace(
            metadata=SimpleNamespace(name="r-model", creation_timestamp=at(statefulset_created))
        )
        return [SimpleNamespace(metadata=meta)], [statefulset]

    earlier = obj("c-old", "Completed", "2026-03-01T00:05:00Z", "2026-03-01T00:05:02Z")
    # upgraded (or preempted): the StatefulSet is the one the checkpoint was taken of, only its pod is new
    since = resume.stack_since(*stack("2026-03-01T00:00:00Z", "2026-03-01T00:10:00Z"))
    assert since == "2026-03-01T00:00:00Z" and resume.of_this_stack(earlier, since)
    # reinstalled after the checkpoint: new StatefulSets, so the earlier install's checkpoint is not resumed
    since = resume.stack_since(*stack("2026-03-01T00:09:00Z", "2026-03-01T00:09:01Z"))
    assert not resume.of_this_stack(earlier, since)
    # nor one of the very second the new StatefulSets were made (the API's times are whole seconds)
    assert not resume.of_this_stack(obj("c-same", "Completed", "2026-03-01T00:09:00Z", "2026-03-01T00:09:00Z"), since)
    # a checkpoint the reinstalled stack takes is its own
    later = obj("c-new", "Completed", "2026-03-01T00:12:00Z", "2026-03-01T00:12:02Z")
    assert resume.of_this_stack(later, since)


def test_a_final_checkpoint_whose_storage_did_not_answer_its_claim_is_claimed_again_within_its_deadline() -> None:
    from gym_operator.controllers.checkpoint import claim_again
    from gym_services.coordination.transaction import TransactionKind, TransactionPhase, TransactionResult

    def result(status: str, phase: TransactionPhase) -> TransactionResult:
        return TransactionResult(
            kind=TransactionKind.CHECKPOINT, checkpoint_id="c", location="s3://b", status=status, phase=phase
        )

    unclaimed = result("failed", TransactionPhase.PENDING)  # the claim's storage did not answer: nothing touched
    stop = asyncio.Event()
    assert claim_again(unclaimed, True, 20.0, stop)
    assert not claim_again(unclaimed, False, 20.0, stop)  # a checkpoint not final: its schedule runs it again
    assert not claim_again(unclaimed, True, 4.0, stop)  # too near its deadline to prepare and publish
    assert not claim_again(result("failed", TransactionPhase.PREPARING), True, 20.0, stop)  # touched: all or nothing
    assert not claim_again(result("completed", TransactionPhase.COMPLETED), True, 20.0, stop)
    stop.set()
    assert not claim_again(unclaimed, True, 20.0, stop)  # deleted, or past its deadline
