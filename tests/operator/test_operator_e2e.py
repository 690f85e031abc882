"""The whole demo stack behind Pods, its collection running: the operator's Checkpoint, every process killed, a
Restore on new pods, and the collection finishes like an uninterrupted one."""

from __future__ import annotations

import pytest
from tests.operator.harness import (
    apply,
    checkpoint_doc,
    get,
    participant_pods,
)

from gym_services.stack.launcher import stack_secrets, stop_stack

pytestmark = pytest.mark.k8s


@pytest.mark.e2e
def test_whole_stack_checkpoint_and_restore_resources_finish_like_uninterrupted(
    operator_env, kubectl, tmp_path
) -> None:
    """Every demo server as a process behind a Pod, collection running: a Checkpoint taken by the operator, every
    process SIGKILLed, fresh processes on new pods, a Restore — the collection finishes with the rewards of an
    uninterrupted run and no episode twice."""
    from gym_services.demo.report import compare
    from gym_services.demo.story import Run, Story, job_status, read_results, wait_job

    start_operator, _ = operator_env
    # at 120 tokens/s the whole collection took ~4 s: under load the operator could take the checkpoint after the
    # last rollout finished (nothing in flight to restore); at 30 the 60% left after the wait take ~10 s
    story = Story(tmp_path / "story", tokens_per_second=30.0, say=lambda text: None)
    story.prepare()
    base = story.uninterrupted()
    state = story.start("k8s")
    token = stack_secrets(tmp_path / "story" / "k8s")["control_token"]
    output = tmp_path / "story" / "k8s.jsonl"
    try:
        participant_pods(kubectl, state, token)
        operator_stack = type("S", (), {"token": token})()
        start_operator(operator_stack)  # returns once kopf is up: the Checkpoint below is seen at once
        story.submit(state, output)
        story.wait_for_progress(state, 240)  # 40% of the rollouts finished, the rest in flight
        apply(kubectl, checkpoint_doc("whole", prepareTimeoutSeconds=30, leaseSeconds=30))
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "checkpoint/whole", "--timeout=90s", timeout=100)
        status = get(kubectl, "checkpoint", "whole")["status"]
        assert status["participantCount"] == len(state.participants())
        assert status["episodes"] > 0, ("the checkpoint caught no live episode", job_status(state))
    finally:
        stop_stack(tmp_path / "story" / "k8s", kill=True)
    state = story.start("k8s")
    try:
        participant_pods(kubectl, state, token)
        apply(
            kubectl,
            {
                "apiVersion": "gym-checkpoint.dev/v1alpha1",
                "kind": "Restore",
                "metadata": {"name": "whole-rs"},
                "spec": {"checkpointRef": {"name": "whole"}},
            },
        )
        kubectl("wait", "--for=jsonpath={.status.phase}=Completed", "restore/whole-rs", "--timeout=90s", timeout=100)
        import asyncio

        asyncio.run(wait_job(state, 240, None))
    finally:
        stop_stack(tmp_path / "story" / "k8s")
    run = Run()
    read_results(output, run)
    restored = get(kubectl, "restore", "whole-rs")["status"]
    assert restored["attempt"] == 1 and restored["restoredEpisodes"] >= 1, (
        f"the checkpoint caught no episode in flight: {restored}"
    )
    verdict = compare(base, run, story.agent_env, tokens=False)  # token accounting: tests/e2e
    assert verdict.ok, verdict.problems
    assert len(run.results) == len(story.tasks) and not run.duplicates
