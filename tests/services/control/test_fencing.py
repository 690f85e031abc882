"""The attempt fence (``control/fencing.py``): older attempts refused, and only rollouts past attempt 0 kept, so a
server that runs for weeks does not hold an entry for every rollout it ever saw."""

from __future__ import annotations

import pytest

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.control.fencing import AttemptFence


def ident(rollout_id: str, attempt: int) -> RolloutIdentity:
    return RolloutIdentity(rollout_id=rollout_id, attempt=attempt)


def test_first_attempts_are_not_remembered() -> None:
    fence = AttemptFence()
    for n in range(10_000):
        fence.observe(ident(f"r-{n}", 0))
    assert len(fence) == 0
    assert fence.highest("r-1") is None
    fence.observe(ident("r-1", 0))  # still accepted: nothing is older than the first attempt


def test_a_later_attempt_is_remembered_and_older_ones_refused() -> None:
    fence = AttemptFence()
    fence.observe(ident("r", 0))
    fence.observe(ident("r", 2))
    assert len(fence) == 1 and fence.highest("r") == 2
    for stale in (0, 1):
        with pytest.raises(ApiError) as refused:
            fence.observe(ident("r", stale))
        assert refused.value.code is ErrorCode.STALE_ATTEMPT
    assert fence.highest("r") == 2  # a refused call changes nothing
    fence.observe(ident("r", 2))
    fence.observe(ident("other", 0))
    assert len(fence) == 1


def test_restore_and_retire_advance_a_rollout_never_seen() -> None:
    fence = AttemptFence()
    fence.advance("restored", 1)
    fence.advance("restored", 0)  # never lowers it
    fence.advance("fresh", 0)  # attempt 0 is where every rollout starts: nothing to keep
    assert len(fence) == 1 and fence.highest("restored") == 1
    with pytest.raises(ApiError):
        fence.check(ident("restored", 0))
    fence.check(ident("restored", 1))
