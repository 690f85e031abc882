"""The attempt fence (``control/fencing.py``): older attempts refused, and only rollouts past attempt 0 kept, so a
server that runs for weeks does not hold an entry for every rollout it ever saw."""

from __future__ import annotations

import pytest

from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.control.fencing import AttemptFence, LeaderFence


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


def test_the_leader_fence_refuses_an_older_term_of_a_leadership() -> None:
    fence = LeaderFence()
    fence.observe("rl/gym-operator/3")
    fence.observe("rl/gym-operator/3")  # the same term again: fine
    fence.observe("other/gym-operator/1")  # another leadership (another release): its own terms
    with pytest.raises(ApiError) as refused:
        fence.observe("rl/gym-operator/2")
    assert refused.value.code is ErrorCode.STALE_LEADER
    fence.observe("rl/gym-operator/4")
    for malformed in ("rl/gym-operator", "3", "rl/gym-operator/x", "rl/gym-operator/-1", "/5"):
        with pytest.raises(ApiError) as bad:
            fence.observe(malformed)
        assert bad.value.code is ErrorCode.BAD_REQUEST, malformed


async def test_control_calls_of_an_older_leader_term_are_refused_and_change_nothing() -> None:
    """Through a real server's control routes: a call naming leadership term 1 after term 2 called is `409
    stale_leader` and does nothing (the call of the stale leader that was already on its way when it froze); calls
    naming no term (the CLI, a local stack) are not fenced."""
    from tests.support.asgi import TOKEN, base_config, serve

    from gym_services.base.config import ServerConfig, load_config
    from gym_services.control.participant import NothingToRestore
    from gym_services.control.protocol import CONTROL_PREFIX, LEADER_TERM_HEADER
    from gym_services.server.app import create_server_app

    class Quiet(NothingToRestore):
        role = "environment"

    app = create_server_app(load_config(ServerConfig, overrides=base_config("fenced")), Quiet(), [])
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with serve(app) as client:

        async def prepare(term: str | None) -> tuple[int, dict]:
            headers = {**auth, **({LEADER_TERM_HEADER: term} if term else {})}
            body = {"checkpoint_id": "ck", "deadline_s": 5, "lease_s": 30}
            answer = await client.post(f"{CONTROL_PREFIX}/prepare", json=body, headers=headers)
            return answer.status_code, answer.json()

        async def phase() -> str:
            return (await client.get(f"{CONTROL_PREFIX}/status", headers=auth)).json()["phase"]

        status = await client.get(f"{CONTROL_PREFIX}/status", headers={**auth, LEADER_TERM_HEADER: "rl/op/2"})
        assert status.status_code == 200
        code, body = await prepare("rl/op/1")
        assert code == 409 and body["error"]["code"] == "stale_leader", body
        assert await phase() == "fresh"  # refused before the control plane saw it: still fresh
        assert (await prepare("rl/op/2"))[0] == 200
        assert (await client.post(f"{CONTROL_PREFIX}/abort", json={"checkpoint_id": "ck"}, headers=auth)).is_success
