"""The one backoff of every retry loop: waits double up to their longest, never end past the deadline, the
deadline counts from the first failure in a row, and a success starts over."""

from __future__ import annotations

import pytest

from gym_services.base.backoff import Backoff


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_waits_double_up_to_the_longest() -> None:
    retry = Backoff(0.2, 1.0, clock=Clock())
    waits = []
    for _ in range(6):
        assert retry.failed()
        waits.append(retry.wait_s())
    assert waits == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_the_deadline_counts_from_the_first_failure_and_no_wait_passes_it() -> None:
    clock = Clock()
    retry = Backoff(1.0, 8.0, deadline_s=10.0, clock=clock)
    clock.now += 50  # nothing failed yet: time before the first failure does not count
    assert retry.failing_s == 0.0
    assert retry.failed()
    waits = []
    while retry.failed():
        wait = retry.wait_s()
        waits.append(wait)
        clock.now += wait
    assert waits == [1.0, 2.0, 4.0, 3.0]  # the last one ends at the deadline, not 8 s later
    assert retry.failing_s == 10.0
    assert not retry.failed()  # stays given up
    assert retry.wait_s() == 0.0


def test_a_success_starts_over() -> None:
    clock = Clock()
    retry = Backoff(0.5, 4.0, deadline_s=3.0, clock=clock)
    assert retry.failed() and retry.wait_s() == 0.5
    clock.now += 2.5
    assert retry.failed() and retry.wait_s() == 0.5  # 1.0 would pass the deadline
    retry.reset()
    clock.now += 1.0
    assert retry.failing_s == 0.0
    assert retry.failed() and retry.wait_s() == 0.5  # a fresh deadline and the first wait again
    clock.now += 2.9
    assert retry.failed()
    clock.now += 0.1
    assert not retry.failed()


@pytest.mark.parametrize(("first", "longest", "deadline"), [(0, 1, 5), (-1, 1, 5), (1, 0, 5), (1, 2, 0)])
def test_bad_settings_are_refused(first: float, longest: float, deadline: float) -> None:
    with pytest.raises(ValueError):
        Backoff(first, longest, deadline_s=deadline)
