"""Chaos kind (e) in CI (benchmarks/chaos.py --storage embedded-s3 draws it at random): the local S3 server (SeaweedFS)
SIGKILLed while a sync checkpoint persists under the pause, and started again on the same ports and data a moment later.
The checkpoint fails and is never published, the pause ends as soon as it failed (not a lease later), collection
carries on, and once S3 is back the next checkpoint completes and is restored into fresh processes; at the end every
(task, repeat) has exactly one result row, none an error, the results file valid JSONL."""

from __future__ import annotations

import json
import random

import pytest
from benchmarks.chaos import Chaos

from gym_services.control.protocol import CheckpointMethod
from gym_services.coordination.transaction import TransactionPhase
from gym_services.demo.story import Run, Story
from gym_services.stack.launcher import stop_stack
from gym_services.stack.objectstore import EMBEDDED_S3

pytestmark = pytest.mark.e2e


def test_s3_killed_during_a_sync_persist_loses_nothing(tmp_path) -> None:
    story = Story(
        tmp_path / "story",
        storage=EMBEDDED_S3,
        repeats=1,
        concurrency=16,
        tokens_per_second=60.0,
        timeout_s=240,
        say=lambda text: None,
    )
    chaos: Chaos | None = None
    try:
        story.prepare()
        lines = story.tasks_path.read_text().splitlines()[::3]  # a third of the tasks, every environment
        story.tasks_path.write_text("".join(line + "\n" for line in lines))
        expected = {f"{task}-0" for task in range(len(lines))}
        chaos = Chaos(story, Run(), random.Random(5), say=lambda text: None)
        chaos.start()
        story.submit(chaos.state, chaos.output)
        assert chaos.wait_for_a_moment(), "the job ended before the fault"
        chaos.cycle_e(how="kill", method=CheckpointMethod.SYNC, at=TransactionPhase.PERSISTING, outage_s=0.5)
        note = chaos.outcome.notes[0]
        assert "checkpoint failed" in note, note  # S3 refused every write: the persist failed (and was never published)
        chaos.finish(240)
        rows = [json.loads(line) for line in chaos.output.read_text(encoding="utf-8").splitlines()]
        ids = [row["_ng_rollout_id"] for row in rows]
        assert sorted(ids) == sorted(expected), (len(ids), len(set(ids)), sorted(expected - set(ids))[:5])
        assert not [row for row in rows if "error" in row]
        assert chaos.newest is not None and chaos.published(chaos.newest)  # the checkpoint after S3 came back
    finally:
        if chaos is not None:
            stop_stack(chaos.dir, kill=True)
        story.close()
