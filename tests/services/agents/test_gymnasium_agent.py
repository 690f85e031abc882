"""gymnasium_agent against the blackjack environment with the real policy model (blackjack-basic).

Rollout ``bj-64`` deals a hand the policy plays in three steps (the deal is seeded from
the rollout id), so there are positions before, between and after steps. The
environment is prepared first; a step still running there finishes before its prepare
answers, and the agent then parks at its next boundary.
"""

from __future__ import annotations

import asyncio

import pytest
from tests.services.agents.real import gym_stack, live_generation_tokens, model_calls, model_totals
from tests.services.agents.stack import agent_blocked, checkpoint_and_continue, stack, uninterrupted, wait_for
from tests.services.agents.wire import Call, Wire

from gym_services.models.inference_worker.policies.base import load_tasks

ROW = load_tasks("blackjack")[0]
ROLLOUT = "bj-64"
_expected: dict[str, dict] = {}


def counts(wire: Wire) -> dict[str, int]:
    return {
        "reset": len(wire.data_calls("env", "/reset", ok=True)),
        "generate": len(model_calls(wire)),
        "step": len(wire.data_calls("env", "/step", ok=True)),
        "close": len(wire.data_calls("env", "/close", ok=True)),
    }


@pytest.fixture
async def expected(worker) -> dict:
    if "result" not in _expected:
        result, wire = await uninterrupted(gym_stack(worker.url), ROW, ROLLOUT)
        _expected["result"], _expected["counts"] = result, counts(wire)
    result = _expected["result"]
    assert result["terminated"] is True and result["truncated"] is False and result["reward"] == 1.0
    assert _expected["counts"] == {"reset": 1, "generate": 3, "step": 3, "close": 0}
    return result


def nth(host: str, path: str, n: int):
    seen = {"count": 0}

    def match(call: Call) -> bool:
        if call.host != host or call.path != path:
            return False
        seen["count"] += 1
        return seen["count"] == n + 1

    return match


async def test_generation_in_flight(worker, expected, tmp_path) -> None:
    async def arrange(s):
        sent = s.wire.watch(nth("model", "/v1/responses", 1))
        model = s.wire.apps["model"]

        async def reached():
            await sent.wait()
            await wait_for(lambda: live_generation_tokens(model) >= 3, what="tokens of the generation")

        return reached

    out = await checkpoint_and_continue(gym_stack(worker.url), ROW, ROLLOUT, f"file://{tmp_path}", arrange=arrange)
    assert out.result == expected
    assert counts(out.restored_wire) == {"reset": 0, "generate": 2, "step": 2, "close": 0}
    assert model_totals(out.restored_wire.apps["model"])["tokens_reused"] > 0
    assert out.first_run.status_code == 409


async def test_step_running_in_the_environment(worker, expected, tmp_path) -> None:
    """The first /step is inside blackjack (0.4 s latency) at prepare: the environment waits for it."""

    async def arrange(s):
        sent = s.wire.watch(nth("env", "/step", 0))
        return sent.wait

    factory = gym_stack(worker.url, step_latency_s=0.4)
    out = await checkpoint_and_continue(factory, ROW, ROLLOUT, f"file://{tmp_path}", arrange=arrange)
    assert out.result == expected
    # restored from the boundary after step 1: the environment's restored game deals the same cards
    assert counts(out.restored_wire) == {"reset": 0, "generate": 2, "step": 2, "close": 0}
    saved = {p.participant_id: p.episodes for p in out.checkpoint.participants}
    assert saved["env"] == 1 and saved["agent"] == 1
    assert out.checkpoint.timings["prepare"] >= 0.2  # prepare waited for the running step


async def test_step_reply_in_flight(worker, expected, tmp_path) -> None:
    """The second step's reply is on its way back: the agent reports it as a blocker until it lands."""

    async def arrange(s):
        hold = s.wire.hold(nth("env", "/step", 1))
        return hold.arrived.wait

    async def during_prepare(s):
        await wait_for(lambda: agent_blocked(s), what="the agent to wait for the step")
        s.wire.holds[0].release.set()

    out = await checkpoint_and_continue(
        gym_stack(worker.url), ROW, ROLLOUT, f"file://{tmp_path}", arrange=arrange, during_prepare=during_prepare
    )
    assert out.result == expected
    assert counts(out.restored_wire) == {"reset": 0, "generate": 1, "step": 1, "close": 0}


async def test_final_step_finishing_during_prepare(worker, expected, tmp_path) -> None:
    async def arrange(s):
        hold = s.wire.hold(nth("env", "/step", 2))
        return hold.arrived.wait

    async def during_prepare(s):
        await wait_for(lambda: agent_blocked(s), what="the agent to wait for the final step")
        s.wire.holds[0].release.set()

    out = await checkpoint_and_continue(
        gym_stack(worker.url), ROW, ROLLOUT, f"file://{tmp_path}", arrange=arrange, during_prepare=during_prepare
    )
    assert out.result == expected
    # the episode ended during prepare: nothing is left to call (blackjack asks for no explicit close)
    assert counts(out.restored_wire) == {"reset": 0, "generate": 0, "step": 0, "close": 0}
    assert out.history == ["return"]


async def test_closed_environment_sends_the_step_back_to_its_boundary(worker, expected) -> None:
    """The environment's 409 checkpoint_parked returns the episode to its step boundary; it parks, then resumes."""
    async with stack(gym_stack(worker.url)) as s:
        hold = s.wire.hold(nth("model", "/v1/responses", 0))
        run = asyncio.create_task(s.run(ROW, ROLLOUT))
        await asyncio.wait_for(hold.arrived.wait(), 10)
        env, agent = s.control("env"), s.control("agent")
        assert (await env.prepare("ck-e"))["status"] == "prepared"
        hold.release.set()
        refused = lambda: [c for c in s.wire.data_calls("env", "/step") if c.status == 409]  # noqa: E731
        await wait_for(lambda: len(refused()) >= 2, what="refused steps")
        assert (await agent.prepare("ck-e"))["status"] == "prepared"
        await wait_for(lambda: s.participant.describe(ROLLOUT)["parked"], what="the episode to park")
        assert s.participant.describe(ROLLOUT)["boundary"] == "step"
        seen = len(s.wire.data_calls("env"))
        await asyncio.sleep(0.4)
        assert len(s.wire.data_calls("env")) == seen
        await agent.resume("ck-e")
        await env.resume("ck-e")
        reply = await asyncio.wait_for(run, 30)
        assert reply.status_code == 200 and reply.json() == expected


async def test_run_without_rollout_id_is_refused(worker) -> None:
    async with stack(gym_stack(worker.url)) as s:
        reply = await s.run(ROW, None)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "rollout_id_required"
