"""A parked call's ``Retry-After`` (``control/admission.py``): come back after half the time left until this pause
has lasted as long as the last one did, within 20-250 ms (a fixed 100 ms step made a call meeting the
start of a pause wait the whole pause and up to a step more; the whole time left, as long as the last pause)."""

from __future__ import annotations

import pytest

from gym_services.control import admission as admission_module
from gym_services.control.admission import Admission
from gym_services.control.protocol import Phase


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(admission_module.time, "monotonic", clock)
    return clock


def pause(admission: Admission, clock: Clock, seconds: float, checkpoint_id: str = "c") -> None:
    admission.set(False, checkpoint_id, Phase.PREPARING)
    admission.set(False, checkpoint_id, Phase.PREPARED)
    clock.now += seconds
    admission.set(False, checkpoint_id, Phase.CAPTURED)
    admission.set(True, None, Phase.OPEN)


def test_the_first_pause_uses_a_guess(clock: Clock) -> None:
    admission = Admission("p")
    admission.set(False, "c1", Phase.PREPARING)
    assert admission.retry_after() == pytest.approx(0.05)
    clock.now += 0.04
    assert admission.retry_after() == pytest.approx(0.03)
    clock.now += 0.03
    assert admission.retry_after() == pytest.approx(0.02)  # the floor
    clock.now += 1
    assert admission.retry_after() == pytest.approx(0.02)  # longer than expected: come back soon, not at once


def test_later_pauses_follow_the_last_one(clock: Clock) -> None:
    admission = Admission("p")
    pause(admission, clock, 0.18)
    admission.set(False, "c2", Phase.PREPARING)
    assert admission.retry_after() == pytest.approx(0.09)
    clock.now += 0.1
    admission.set(False, "c2", Phase.PREPARED)  # a phase change inside the pause does not restart it
    assert admission.retry_after() == pytest.approx(0.04)
    clock.now += 0.08
    admission.set(True, None, Phase.OPEN)
    pause(admission, clock, 3.0)  # an unusually long pause: the next estimate is capped
    admission.set(False, "c4", Phase.PREPARING)
    assert admission.retry_after() == pytest.approx(0.25)


def test_a_restore_does_not_count_as_a_pause(clock: Clock) -> None:
    admission = Admission("p")
    pause(admission, clock, 0.05)
    admission.set(False, "c", Phase.RESTORING)
    clock.now += 5
    admission.set(True, None, Phase.OPEN)
    admission.set(False, "c2", Phase.PREPARING)
    assert admission.retry_after() == pytest.approx(0.025)


def test_a_call_meeting_a_shorter_pause_overshoots_its_end_by_less_than_half_the_estimate(clock: Clock) -> None:
    """A client that follows every Retry-After from the start of a pause comes back, after the pause ended, within
    half of (the last pause minus this one) or the floor - not at the last pause's full length."""
    admission = Admission("p")
    pause(admission, clock, 0.2)
    admission.set(False, "c2", Phase.PREPARING)
    started, ends, retries = clock.now, clock.now + 0.12, 0
    while clock.now < ends:
        clock.now += admission.retry_after()
        retries += 1
    assert clock.now - ends <= max((0.2 - 0.12) / 2, 0.02) + 1e-9
    assert clock.now - started < 0.2  # the whole estimate would have meant 200 ms
    assert retries <= 4
