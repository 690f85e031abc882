"""The chaos suite's short CI run (benchmarks/chaos.py runs the long one): the demo stack collecting rollouts over
every environment through one cycle of each fault kind, in order: (a) checkpoint -> SIGKILL everything -> restore,
(b) a random process SIGKILLed during a checkpoint -> restore the newest complete one, (c) the coordinator SIGKILLed
mid-transaction -> everyone reopens within the lease, (d) the inference worker SIGKILLed mid-generation. Then every
(task, repeat) exactly once with the uninterrupted reward, no error row, valid JSONL."""

from __future__ import annotations

import random

import pytest
from benchmarks.chaos import Chaos

from gym_services.demo.story import Story

pytestmark = pytest.mark.e2e


def test_one_cycle_of_each_fault_kind_loses_nothing(tmp_path) -> None:
    story = Story(
        tmp_path / "story", repeats=1, concurrency=16, tokens_per_second=60.0, timeout_s=240, say=lambda text: None
    )
    story.prepare()
    base = story.uninterrupted()
    chaos = Chaos(story, base, random.Random(16), order="abcd", say=lambda text: None)
    chaos.run(cycles=4)
    outcome = chaos.outcome
    print(outcome.table("file"), *outcome.notes, sep="\n")
    assert dict(outcome.cycles) == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert outcome.ok, (outcome.differences, outcome.duplicates, outcome.missing, outcome.errors, outcome.invalid_lines)
    assert outcome.rollouts and outcome.rollouts % len(story.tasks) == 0  # whole jobs (one restarts if it ends first)
