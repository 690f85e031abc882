"""A preemption with nobody watching, through the CLI and real processes: SIGTERM to every server of the stack (or to
one of them) while a job runs, no checkpoint command; the stack takes its final checkpoint and exits; `gymckpt up`
resumes it by itself and the job completes with every reward and training token equal to an uninterrupted run's,
0 tokens regenerated, no result twice, none missing (``docs/protocol.md``, "Termination")."""

from __future__ import annotations

import pytest
from tests.e2e.preemption import Preempted, uninterrupted, verdict

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
