"""A checkpoint's blockers name the server that holds them: an episode of the agent waiting on a slow tool call is
reported with the resources server it waits on, and the call, not only as the agent's."""

from __future__ import annotations

import asyncio

from tests.services.agents.stack import stack
from tests.services.agents.test_agent_machinery import ROLLOUT, ROW, factory
from tests.services.agents.wire import is_call

from gym_services.commands.output import transaction_summary


async def test_a_slow_tool_call_is_reported_on_the_server_it_waits_for(tmp_path) -> None:
    async with stack(factory) as s:
        hold = s.wire.hold(is_call("counter", "/increment", by=-1))  # the resources server is slow to answer
        run = asyncio.create_task(s.run(ROW, ROLLOUT, 0))
        await asyncio.wait_for(hold.arrived.wait(), 10)
        result = await s.coordinator.checkpoint("ck", f"file://{tmp_path}", prepare_timeout_s=0.3)
        hold.release.set()
        reply = await asyncio.wait_for(run, 10)
    assert not result.completed and reply.status_code == 200
    (blocker,) = result.blockers
    assert blocker.participant == "agent" and blocker.server == "resources"
    assert (
        "inside waited step 'tool'" in blocker.detail and "for resources (http://counter/increment)" in blocker.detail
    )
    assert "on agent (waiting on resources)" in result.error
    header, _, row = transaction_summary(result).split("blockers:\n")[1].splitlines()[:3]
    assert header.split()[3:5] == ["waiting", "on"] and row.split()[:4] == ["agent", "episode", ROLLOUT, "resources"]
