"""A preemption while checkpoint storage is unreachable (the stack's S3 store stopped at the signal): the final
checkpoint fails within the grace and publishes nothing, every process exits, and the next `gymckpt up` says which
older checkpoint it resumes from and how much older it is; the job then completes with every reward and training
token equal to an uninterrupted run's (the work since that checkpoint is done again as attempt + 1)."""

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


def test_storage_down_at_the_signal_resumes_from_the_newest_scheduled_checkpoint(tmp_path) -> None:
    base, agent_env = uninterrupted(tmp_path / "uninterrupted")
    stack = Preempted(tmp_path / "stack", storage="embedded-s3", grace="8s")
    try:
        stack.up()
        stack.collect()
        stack.wait_checkpoints(1)
        stack.wait_in_flight()
        newest = stack.history().last_successful()
        assert newest is not None
        stop_local_s3(stack.state_dir / "s3")  # storage goes away ...
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
