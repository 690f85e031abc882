"""A parked call's ``Retry-After`` (``control/admission.py``): come back when this pause has lasted as long as the
last one did, within 20-250 ms (issue 29: a fixed 100 ms step made a call meeting the start of a pause wait the
whole pause and up to a step more)."""

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
    assert admission.retry_after() == pytest.approx(0.1)
    clock.now += 0.06
    assert admission.retry_after() == pytest.approx(0.04)
    clock.now += 1
    assert admission.retry_after() == pytest.approx(0.02)  # longer than expected: come back soon, not at once


def test_later_pauses_follow_the_last_one(clock: Clock) -> None:
    admission = Admission("p")
    pause(admission, clock, 0.18)
    admission.set(False, "c2", Phase.PREPARING)
    assert admission.retry_after() == pytest.approx(0.18)
    clock.now += 0.1
    admission.set(False, "c2", Phase.PREPARED)  # a phase change inside the pause does not restart it
    assert admission.retry_after() == pytest.approx(0.08)
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
    assert admission.retry_after() == pytest.approx(0.05)
