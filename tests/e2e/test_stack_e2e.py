"""Process-level end to end: every server a real uvicorn process, rollout collection running, a
checkpoint mid-flight into a real S3 server (the local SeaweedFS of ``gymckpt demo --storage embedded-s3``),
every process SIGKILLed, restore into fresh processes, collection finished — results equal an uninterrupted
run's."""

from __future__ import annotations

import pytest

from gym_services.demo.report import compare
from gym_services.demo.story import Story

pytestmark = pytest.mark.e2e


def test_checkpoint_kill_restore_equals_uninterrupted(tmp_path) -> None:
    story = Story(
        tmp_path / "story",
        storage="embedded-s3",
        repeats=1,
        # 8 at a time, so that at the trigger more tasks wait than run: episodes stay in flight for waves after it,
        # however late a busy machine starts the checkpoint (with 32 at a time every task ran at once, and under two
        # busy loops all had finished before the checkpoint, at 120 and again at 40 tokens/s: 0 in flight)
        concurrency=8,
        tokens_per_second=40.0,
        checkpoint_at=0.3,
        timeout_s=240,
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

    # the checkpoint caught work in flight and went to S3
    assert ckpt.checkpoint is not None and ckpt.checkpoint.location == "s3://gymckpt/demo"
    assert ckpt.in_flight["collection"]["episodes"] > 0
    assert ckpt.restore is not None and len(ckpt.restore.episodes) == ckpt.in_flight["collection"]["episodes"]
    # every task has exactly one result, none ran twice, generation work was not redone
    assert len(ckpt.results) == len(base.results) == len(story.tasks)
    assert not ckpt.duplicates
    assert ckpt.tokens_before_cut + ckpt.tokens_after_restore == base.tokens_generated
    # a late call from the old attempt is refused
    assert ckpt.stale_call["status"] == 409 and ckpt.stale_call["code"] == "stale_attempt"
    # every environment took part
    assert {story.agent_env[row["agent"]] for row in ckpt.results.values()} == {
        "workplace_assistant",
        "indirect_prompt_injection",
        "blackjack",
        "math_formal_lean",
    }
