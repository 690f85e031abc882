"""A late call of an old attempt cannot write into the restored attempt's state, whatever headers it carries: a real
counter process, checkpointed by the coordinator, SIGKILLed, restored into a fresh process; the old attempt's cookie
sent with no identity headers is refused (``409 stale_attempt``), and the restored episode's reward stays 1.0."""

from __future__ import annotations

import httpx
import pytest

from gym_services.coordination.client import ControlClient, ParticipantRef
from gym_services.coordination.coordinator import Coordinator
from gym_services.stack.config import ServerSpec, StackConfig
from gym_services.stack.launcher import stack_secrets, start_stack, stop_stack

pytestmark = pytest.mark.e2e
OLD = {"x-ng-rollout-id": "r1", "x-ng-attempt": "0"}
NEW = {"x-ng-rollout-id": "r1", "x-ng-attempt": "1"}


def coordinator(state, client: ControlClient) -> Coordinator:
    return Coordinator([ParticipantRef(s.name, "resources", s.url) for s in state.servers], client)


async def test_a_header_less_late_call_leaves_the_restored_reward_at_one(tmp_path) -> None:
    state_dir = tmp_path / "stack"
    config = StackConfig(name="late", state_dir=str(state_dir), servers={"counter-0": ServerSpec(server="counter")})
    token = stack_secrets(state_dir)["control_token"]
    location = f"file://{tmp_path / 'store'}"
    try:
        first = start_stack(config, tmp_path)
        with httpx.Client(base_url=first.servers[0].url, timeout=10) as http:
            assert http.post("/seed_session", json={"start": 1}, headers=OLD).json()["value"] == 1
            assert http.post("/increment", json={"by": 3}, headers=OLD).json() == {"output": 4}
            cookies = dict(http.cookies)
        async with ControlClient(token, timeout_s=10) as client:
            checkpointed = await coordinator(first, client).checkpoint("ck", location, prepare_timeout_s=5)
        assert checkpointed.completed, checkpointed.error
    finally:
        stop_stack(state_dir, kill=True)
    try:
        fresh = start_stack(config, tmp_path)
        async with ControlClient(token, timeout_s=10) as client:
            restored = await coordinator(fresh, client).restore("ck", location)
        assert restored.completed and restored.episodes == {"r1": 1}, restored.error
        with httpx.Client(base_url=fresh.servers[0].url, cookies=cookies, timeout=10) as http:
            late = http.post("/increment", json={"by": 100})  # the old attempt's cookie, no identity headers
            assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt", late.text
            assert http.post("/increment", json={"by": 6}, headers=NEW).json() == {"output": 10}
            assert http.post("/verify", json={"target": 10}, headers=NEW).json() == {"reward": 1.0, "value": 10}
    finally:
        stop_stack(state_dir, kill=True)
