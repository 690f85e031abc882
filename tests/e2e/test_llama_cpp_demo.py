"""``gymckpt demo --engine llama.cpp``: the whole story on a real inference engine. llama.cpp's llama-server
(the engine extra) serves the tiny generated model as the stack's inference worker, every other server is its
own uvicorn process; an uninterrupted run, then a checkpoint mid-flight, SIGKILL of every process, a restore
into fresh processes. With random weights the episodes end by their token and turn limits; what must hold is
that rewards equal the uninterrupted run's, no token is generated twice, and every rollout's training tokens
(result rows and token ledgers) carry the uninterrupted run's ids and log-probs, bit for bit."""

from __future__ import annotations

import pytest

from gym_services.demo.report import compare, regenerated_tokens
from gym_services.demo.story import Story

pytestmark = pytest.mark.e2e


def test_demo_on_llama_cpp_equals_the_uninterrupted_run(tmp_path) -> None:
    story = Story(
        tmp_path / "story",
        engine="llama.cpp",
        repeats=1,
        tasks_per_environment=2,  # 8 tasks, every environment and agent: all in flight at once
        concurrency=8,
        checkpoint_at=0.25,
        timeout_s=600,
        say=lambda text: None,
    )
    try:
        story.prepare()
        base = story.uninterrupted()
        ckpt = story.checkpointed()
    finally:
        story.close()
    verdict = compare(base, ckpt, story.agent_env)
    assert verdict.ok, verdict.problems
    assert "training tokens identical to the uninterrupted run" in verdict.text

    assert regenerated_tokens(base, ckpt) == 0
    assert ckpt.tokens_before_cut > 0 and ckpt.tokens_after_restore > 0  # generations on both sides of the crash
    assert ckpt.in_flight["collection"]["episodes"] > 0
    assert ckpt.in_flight["policy-model"]["generations"] + ckpt.in_flight["policy-model"]["responses_held"] > 0
    assert len(ckpt.results) == len(base.results) == len(story.tasks) and not ckpt.duplicates
    assert not any("error" in row for row in ckpt.results.values())
    # every rollout carries token ids a trainer reads, and the checkpointed run's equal the uninterrupted run's
    assert all(ckpt.ledgers[rid].entries for rid in ckpt.results)
    assert ckpt.stale_call["status"] == 409 and ckpt.stale_call["code"] == "stale_attempt"
