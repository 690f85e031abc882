"""A preemption with nobody watching, through the CLI and real processes: SIGTERM to every server of the stack (the
Lean sandbox, a backend, a moment before the others, while a proof is on its way to it), or to one of them, while a
job runs, no checkpoint command; the stack takes its final checkpoint and exits; `gymckpt up` resumes it by itself and
the job completes with every reward and training token equal to an uninterrupted run's, 0 tokens regenerated, no
result twice, none missing (``docs/protocol.md``, "Termination"). And the same with checkpoint storage unreachable at
the signal."""

from __future__ import annotations

import time

import pytest
from tests.e2e.preemption import Preempted, uninterrupted, verdict

from gym_services.control.storage import open_storage
from gym_services.control.store import CheckpointStore
from gym_services.demo.report import training_tokens_verdict
from gym_services.stack.launcher import stack_storage_config
from gym_services.stack.objectstore import stop_local_s3

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return uninterrupted(tmp_path_factory.mktemp("uninterrupted"))


@pytest.mark.parametrize("signalled", [None, ["workplace-assistant"]], ids=["every server", "one server"])
def test_sigterm_checkpoints_the_stack_and_up_resumes_it(tmp_path, reference, signalled) -> None:
    base, agent_env = reference
    stack = Preempted(tmp_path)
    try:
        stack.up()
        stack.collect()
        stack.wait_in_flight()
        if signalled is None:  # the Lean sandbox's pod gets the notice first; a proof graded meanwhile must be graded
            stack.wait_lean_episode()  # by the sandbox as ever (a backend keeps serving through its grace), not failed
            graded = stack.lean_verifications()  # as unreachable: that episode would then differ from the reference
            stack.terminate(["lean-sandbox"])
            stack.wait_lean_verified(graded)
        stack.terminate(signalled)
        stack.wait_stopped()
        termination = stack.history().termination
        assert termination is not None and termination.outcome == "published", termination
        assert termination.final is not None and termination.final.episodes > 0  # it caught episodes in flight
        assert termination.signal_to_published_s is not None and termination.signal_to_published_s < 30
        tokens_at_cut = stack.model_tokens_at_exit()

        resumed = stack.up()
        assert f"resumed automatically from {termination.final.checkpoint_id}" in resumed, resumed
        followed = stack.finish()
        assert f"the job resumed from checkpoint {termination.final.checkpoint_id}" in followed, followed
        run = stack.run(tokens_at_cut)
    finally:
        stack.close()
    result = verdict(base, run, agent_env)
    assert result.ok, result.problems  # rewards, training tokens (rows and ledgers), 0 regenerated
    assert len(run.results) == len(base.results) and not run.duplicates  # none missing, none twice
    assert run.tokens_before_cut + run.tokens_after_restore == base.tokens_generated


def test_storage_down_at_the_signal_resumes_from_the_newest_scheduled_checkpoint(tmp_path, reference) -> None:
    """Storage unreachable at the signal (the stack's S3 store stopped): the final checkpoint fails within the
    grace and publishes nothing, every process exits, and the next `gymckpt up` says which older checkpoint it
    resumes from and how much older it is; the job then completes with every reward and training token equal (the
    work since that checkpoint is done again as attempt + 1)."""
    base, agent_env = reference
    stack = Preempted(tmp_path / "stack", storage="embedded-s3", grace="8s")
    try:
        stack.up()
        stack.collect()
        stack.wait_checkpoints(1)
        stack.wait_in_flight()
        newest = stack.history().last_successful()
        assert newest is not None
        stop_local_s3(stack.state_dir / "s3", timeout_s=0)  # storage goes away (killed: a SIGTERM is 5 s more) ...
        signalled = time.monotonic()
        stack.terminate()  # ... and the preemption comes
        stack.wait_stopped()
        assert time.monotonic() - signalled < 8 + 15  # the grace, then the drain: every process exited
        history = stack.history()
        termination = history.termination
        assert termination is not None and termination.outcome == "failed" and termination.error, termination
        assert termination.final is not None and termination.final.status == "failed"
        newest = history.last_successful()
        assert newest is not None and newest.kind == "scheduled"

        resumed = stack.up()  # the S3 store starts again with the stack
        assert f"resumed automatically from {newest.checkpoint_id}, the newest scheduled checkpoint" in resumed
        assert "older than the SIGTERM" in resumed and "the final checkpoint failed" in resumed, resumed
        state = stack.state()
        store = CheckpointStore(open_storage(state.storage, stack_storage_config(state)))
        assert not store.is_published(termination.final.checkpoint_id)  # nothing half-published
        stack.finish()
        run = stack.run(0)
    finally:
        stack.close()
    result = verdict(base, run, agent_env, tokens=False)
    assert result.ok, result.problems  # every reward equal, none missing, none twice
    same, differing, masked = training_tokens_verdict(base, run, sorted(base.results))
    assert same == "yes" and not differing and masked == 0, differing
    assert len(run.results) == len(base.results) and not run.duplicates
