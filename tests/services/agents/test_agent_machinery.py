"""The shared agent machinery, exercised by simple_agent against the counter server and a fake model.

Real apps in process (the counter resources server, a Starlette fake model on the
server base, the agent), the coordinator driving the whole stack's control routes.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from tests.services.agents.fake_model import create_fake_model
from tests.services.agents.stack import agent_blocked, checkpoint_and_continue, stack, uninterrupted, wait_for
from tests.services.agents.wire import Wire, is_call
from tests.support.asgi import base_config

from gym_services.agents.common import AgentParticipant
from gym_services.agents.simple_agent.app import Config as SimpleConfig
from gym_services.agents.simple_agent.app import create_app as simple_agent
from gym_services.base.config import load_config
from gym_services.base.downstream import DOWNSTREAM_PATH, DownstreamReport
from gym_services.control.participant import InvalidState, RestoredRecord
from gym_services.resources.counter.app import Config as CounterConfig
from gym_services.resources.counter.app import create_app as counter_app

ROLLOUT = "task7-0"
ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": json.dumps({"calls": [[3, -1], [10], [5]]})}]},
    "start": 1,
    "target": 18,
}


def factory(wire: Wire):
    model, _ = create_fake_model("model")
    counter = counter_app(load_config(CounterConfig, overrides=base_config("counter")))
    agent = simple_agent(
        load_config(
            SimpleConfig,
            overrides=base_config("agent", model_url="http://model", model="fake", resources_url="http://counter"),
        ),
        transport=wire,
    )
    return {"model": ("model", model), "agent": ("agent", agent), "counter": ("resources", counter)}


def fake(s):
    return s.wire.apps["model"].state.fake


def counts(wire: Wire) -> dict[str, int]:
    return {
        "seed": len(wire.data_calls("counter", "/seed_session", ok=True)),
        "generate": len(wire.data_calls("model", "/v1/responses", ok=True)),
        "increment": len(wire.data_calls("counter", "/increment", ok=True)),
        "verify": len(wire.data_calls("counter", "/verify", ok=True)),
    }


@pytest.fixture
async def expected():
    result, wire = await uninterrupted(factory, ROW, ROLLOUT)
    assert result["reward"] == 1.0 and result["value"] == 18
    assert counts(wire) == {"seed": 1, "generate": 4, "increment": 4, "verify": 1}
    return result


def hold_generation(index: int):
    """Arrange: the index-th generation is in flight at the fake model."""

    async def arrange(s):
        arrived, _ = fake(s).hold(index)
        return arrived.wait

    return arrange


async def test_generation_in_flight(expected, tmp_path) -> None:
    out = await checkpoint_and_continue(factory, ROW, ROLLOUT, f"file://{tmp_path}", arrange=hold_generation(1))
    assert out.result == expected
    assert out.first_run.status_code == 409 and out.first_run.json()["error"]["code"] == "stale_attempt"
    assert out.retired["agent"] is True and out.agent_status_after_retire["live"]["episodes"] == 0
    # continued from the generate boundary: no re-seed, the first generation and both first tools not repeated
    assert counts(out.restored_wire) == {"seed": 0, "generate": 3, "increment": 2, "verify": 1}
    assert out.history[0] == "generate" and out.history[-1] == "return"
    assert out.late is not None and out.late.status_code == 409 and out.late.json()["error"]["code"] == "stale_attempt"


async def test_tool_call_in_flight(expected, tmp_path) -> None:
    async def arrange(s):
        hold = s.wire.hold(is_call("counter", "/increment", by=-1))
        fake(s).hold(1)  # keep attempt 0 from running on after resume: it is retired there
        return hold.arrived.wait

    async def during_prepare(s):
        await wait_for(lambda: agent_blocked(s), what="the agent to report the waited tool call")
        s.wire.holds[0].release.set()

    out = await checkpoint_and_continue(
        factory, ROW, ROLLOUT, f"file://{tmp_path}", arrange=arrange, during_prepare=during_prepare
    )
    assert out.result == expected
    # the tool call finished before prepare answered; its output is in the boundary and never re-run
    assert counts(out.restored_wire) == {"seed": 0, "generate": 3, "increment": 2, "verify": 1}
    assert [c.body["by"] for c in out.restored_wire.data_calls("counter", "/increment")] == [10, 5]
    assert out.first_run.status_code == 409


async def test_checkpoint_between_two_calls_of_one_response(expected, tmp_path) -> None:
    """The first of two function calls of one response was in flight: the second runs after restore, once."""

    async def arrange(s):
        hold = s.wire.hold(is_call("counter", "/increment", by=3))
        fake(s).hold(1)
        return hold.arrived.wait

    async def during_prepare(s):
        await wait_for(lambda: agent_blocked(s), what="the agent to wait for the first tool call")
        s.wire.holds[0].release.set()

    out = await checkpoint_and_continue(
        factory, ROW, ROLLOUT, f"file://{tmp_path}", arrange=arrange, during_prepare=during_prepare
    )
    assert out.result == expected
    assert out.history[0] == "tool"
    assert [c.body["by"] for c in out.restored_wire.data_calls("counter", "/increment")] == [-1, 10, 5]
    assert counts(out.restored_wire) == {"seed": 0, "generate": 3, "increment": 3, "verify": 1}


async def test_wait_verification_finishing_during_prepare(expected, tmp_path) -> None:
    async def arrange(s):
        hold = s.wire.hold(is_call("counter", "/verify"))
        return hold.arrived.wait

    async def during_prepare(s):
        await wait_for(lambda: agent_blocked(s), what="the agent to wait for /verify")
        s.wire.holds[0].release.set()

    out = await checkpoint_and_continue(
        factory, ROW, ROLLOUT, f"file://{tmp_path}", arrange=arrange, during_prepare=during_prepare
    )
    assert out.result == expected
    # the committed boundary is `return`: attempt 1 answers without calling anything
    assert counts(out.restored_wire) == {"seed": 0, "generate": 0, "increment": 0, "verify": 0}
    assert out.history == ["return"]


async def test_run_requires_identity() -> None:
    async with stack(factory) as s:
        reply = await s.run(ROW, None)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "rollout_id_required"
        assert [c for c in s.wire.calls if c.host != "agent"] == []


async def test_parked_model_passes_through_and_run_parks(expected) -> None:
    """The model's 409 reaches /run through the proxy; once the agent is prepared the run stops calling."""
    async with stack(factory) as s:
        hold = s.wire.hold(is_call("counter", "/increment", by=-1))
        run = asyncio.create_task(s.run(ROW, ROLLOUT))
        await asyncio.wait_for(hold.arrived.wait(), 10)
        model, agent = s.control("model"), s.control("agent")
        assert (await model.prepare("ck-p"))["status"] == "prepared"
        hold.release.set()  # the episode reaches the generate boundary and calls the (closed) model

        def refused():
            return [c for c in s.wire.data_calls("model") if c.status == 409]

        await wait_for(lambda: len(refused()) >= 3, what="refused generations")
        assert all(c.reply["error"]["code"] == "checkpoint_parked" for c in refused())
        assert (await agent.prepare("ck-p"))["status"] == "prepared"
        await wait_for(lambda: s.participant.describe(ROLLOUT)["parked"], what="the episode to park")
        seen = len(s.wire.data_calls("model"))
        await asyncio.sleep(0.5)
        assert len(s.wire.data_calls("model")) == seen  # parked: no more calls while the agent is prepared
        assert s.participant.describe(ROLLOUT)["boundary"] == "generate"
        await agent.resume("ck-p")
        await model.resume("ck-p")
        reply = await asyncio.wait_for(run, 10)
        assert reply.status_code == 200 and reply.json() == expected
        metrics = (await s.http.get("http://agent/metrics")).text
        assert 'gym_agent_parked_refusals_total{server="model"}' in metrics


async def test_repeated_run_joins_the_running_attempt(expected) -> None:
    async with stack(factory) as s:
        arrived, release = fake(s).hold(0)
        first = asyncio.create_task(s.run(ROW, ROLLOUT))
        await asyncio.wait_for(arrived.wait(), 10)
        second = asyncio.create_task(s.run(ROW, ROLLOUT))
        await asyncio.sleep(0.05)
        release.set()
        a, b = await asyncio.gather(first, second)
        assert a.json() == b.json() == expected
        assert counts(s.wire)["seed"] == 1


async def test_retire_cancels_and_frees(tmp_path) -> None:
    async with stack(factory) as s:
        arrived, _ = fake(s).hold(1)
        run = asyncio.create_task(s.run(ROW, ROLLOUT))
        await asyncio.wait_for(arrived.wait(), 10)
        assert (await s.status("agent"))["live"]["episodes"] == 1
        retired = await s.coordinator.retire(ROLLOUT, 0)
        assert retired["agent"] is True
        reply = await asyncio.wait_for(run, 5)
        assert reply.status_code == 409 and reply.json()["error"]["code"] == "stale_attempt"
        assert (await s.status("agent"))["live"]["episodes"] == 0
        again = await s.run(ROW, ROLLOUT, 0)
        assert again.status_code == 409  # the retired attempt stays fenced
        prepared = await s.control("agent").prepare("ck-r")
        assert prepared["status"] == "prepared" and prepared["blockers"] == []
        committed = await s.control("agent").capture_persist("ck-r", f"file://{tmp_path}")
        assert committed["records"] == 0


async def test_restore_refuses_foreign_or_malformed_records() -> None:
    async with stack(factory) as s:
        participant: AgentParticipant = s.participant
        good = {
            "schema_version": 1,
            "kind": "gym-checkpoint/agent-episode",
            "agent": "simple_agent",
            "rollout_id": "r1",
            "attempt": 0,
            "boundary": {"name": "generate", "row": {}},
        }

        def record(payload):
            return RestoredRecord("episode-r1", json.dumps(payload).encode(), "r1", 0)

        staged = await participant.validate([record(good)])
        assert staged["r1"].attempt == 1 and participant.episodes == {}  # validate installs nothing
        for bad in (
            {**good, "agent": "proof_refinement_agent"},
            {**good, "attempt": 3},
            {**good, "boundary": {"name": "generate", "row": {}, "model_calls": -1}},
            {**good, "boundary": {"name": "generate", "row": {}, "surprise": 1}},
        ):
            with pytest.raises(InvalidState):
                await participant.validate([record(bad)])
        with pytest.raises(InvalidState):
            await participant.validate([record(good), record(good)])


async def test_concurrent_episodes_keep_their_own_cookies() -> None:
    """Each episode owns its cookies per server: two rollouts at once never share a counter session."""
    other = {
        "responses_create_params": {"input": [{"role": "user", "content": json.dumps({"calls": [[2], [2, 2]]})}]},
        "start": 0,
        "target": 6,
    }
    async with stack(factory) as s:
        a, b = await asyncio.gather(s.run(ROW, "a-0"), s.run(other, "b-0"))
        assert a.json()["reward"] == 1.0 and a.json()["value"] == 18
        assert b.json()["reward"] == 1.0 and b.json()["value"] == 6
        by_rollout: dict[str, set] = {}
        for call in s.wire.data_calls("counter", "/increment"):
            by_rollout.setdefault(call.rollout_id, set()).add(call.attempt)
        assert set(by_rollout) == {"a-0", "b-0"}
        assert s.http.cookies == {} or "gym_session_counter" not in s.http.cookies


async def test_checkpointing_off_runs_without_identity() -> None:
    def plain(wire: Wire):
        apps = factory(wire)
        apps["agent"] = (
            "agent",
            simple_agent(
                load_config(
                    SimpleConfig,
                    overrides=base_config(
                        "agent",
                        model_url="http://model",
                        model="fake",
                        resources_url="http://counter",
                        checkpoint={"enabled": False},
                    ),
                ),
                transport=wire,
            ),
        )
        return apps

    async with stack(plain) as s:
        reply = await s.run(ROW, None)
        assert reply.status_code == 200 and reply.json()["reward"] == 1.0
        assert all(c.rollout_id is None for c in s.wire.data_calls("counter"))


async def test_repeated_run_of_a_finished_attempt_returns_its_result(expected) -> None:
    """A /run whose reply was lost is asked again: the same result, nothing runs twice."""
    async with stack(factory) as s:
        first = await s.run(ROW, ROLLOUT)
        calls = len(s.wire.calls)
        again = await s.run(ROW, ROLLOUT)
        assert first.json() == again.json() == expected
        assert [c for c in s.wire.calls[calls:] if c.host != "agent"] == []
        assert (await s.status("agent"))["live"]["finished"] == 1
        newer = await s.run(ROW, ROLLOUT, 1)  # a new attempt without a restore starts over
        assert newer.json() == expected and counts(s.wire)["seed"] == 2
        assert (await s.coordinator.retire(ROLLOUT, 1))["agent"] is True  # retire frees a kept result too
        assert (await s.status("agent"))["live"]["finished"] == 0


async def test_kept_results_are_bounded_by_bytes(expected) -> None:
    """With room for one result's bytes only, the agent keeps the newest finished result and drops the older; its
    metrics report the one kept and its bytes."""
    async with stack(factory) as s:
        assert (await s.run(ROW, ROLLOUT)).json() == expected
        size = s.participant.finished.bytes  # what one finished episode of this row keeps
    async with stack(retrying_factory(finished_retention_max_bytes=size + size // 2)) as s:
        assert (await s.run(ROW, ROLLOUT)).json() == expected
        assert (await s.run(ROW, "task8-0")).json()["reward"] == 1.0
        assert (await s.status("agent"))["live"]["finished"] == 1
        assert s.participant.finished.get("task8-0") is not None and s.participant.finished.get(ROLLOUT) is None
        assert 0 < s.participant.finished.bytes <= size + size // 2
        metrics = (await s.http.get("http://agent/metrics")).text  # what the agent reports it keeps
        assert "gym_agent_finished_results 1.0" in metrics.splitlines()
        assert f"gym_agent_finished_result_bytes {float(s.participant.finished.bytes)}" in metrics.splitlines()
        assert s.participant.live_token_bytes() == 0  # no live episode, and this row's calls carry no tokens
        for episodes, count in (("live", 0), ("finished", s.participant.finished.token_bytes)):
            assert f'gym_agent_token_bytes{{episodes="{episodes}"}} {float(count)}' in metrics.splitlines()


async def test_a_kept_finished_episode_holds_its_result_only(expected) -> None:
    """A finished episode used to be kept (60 s, up to 1,024 of them) with its whole boundary - the row, every
    output with its token ids, the last response - beside its result, which holds them again (the held memory probe put
    a Workplace episode at about 1 MB). Only the result (and the boundary's name and cookies) is kept, as one compressed
    JSON bytes object (as Python objects it took 3-5 times the memory, and left the allocator fragmented) and its
    calls' token arrays (``test_finished_episodes.py``)."""
    async with stack(factory) as s:
        assert (await s.run(ROW, ROLLOUT)).json() == expected
        kept = s.participant.finished.get(ROLLOUT)
        assert isinstance(kept.packed, bytes) and s.participant.finished.bytes == kept.size
        boundary = kept.boundary()
        assert boundary["result"] == expected and boundary["name"] == "return"
        assert set(boundary) <= {"name", "seq", "row", "cookies", "verify_mode", "result"} and boundary["row"] == {}
        assert (await s.run(ROW, ROLLOUT)).json() == expected


async def test_finished_result_the_controller_still_waits_for_is_saved(expected, tmp_path) -> None:
    """A result in transit to the controller when it commits: saved, and the restored attempt answers it at once."""
    location = f"file://{tmp_path}"
    async with stack(factory) as s:
        assert (await s.run(ROW, ROLLOUT)).json() == expected
        agent = s.control("agent")
        await agent.prepare("ck-none")
        assert (await agent.capture_persist("ck-none", location, episodes=[]))["records"] == 0
        await agent.resume("ck-none")
        await agent.prepare("ck-all")
        assert (await agent.capture_persist("ck-all", location, episodes=None))["records"] == 0
        await agent.resume("ck-all")
        await agent.prepare("ck-1")
        committed = await agent.capture_persist("ck-1", location, episodes=[ROLLOUT])
        assert committed["records"] == 2 and committed["episodes"] == [ROLLOUT]  # its head and one chunk
        await agent.resume("ck-1")
    async with stack(factory) as s:
        agent = s.control("agent")
        restored = await agent.restore("ck-1", location, committed["manifest_key"], committed["manifest_sha256"])
        assert restored["episodes"] == {ROLLOUT: 1}
        await agent.resume("ck-1")
        reply = await s.run(ROW, ROLLOUT, 1)
        assert reply.json() == expected
        assert [c for c in s.wire.calls if c.host != "agent"] == []
        assert s.participant.last_history[ROLLOUT] == ["return"]


def retrying_factory(**agent_config):
    """The same stack, the agent retrying unavailable servers quickly."""

    def build(wire: Wire):
        apps = factory(wire)
        config = base_config(
            "agent",
            model_url="http://model",
            model="fake",
            resources_url="http://counter",
            unavailable_backoff_s=0.01,
            unavailable_backoff_max_s=0.05,
            **agent_config,
        )
        apps["agent"] = ("agent", simple_agent(load_config(SimpleConfig, overrides=config), transport=wire))
        return apps

    return build


async def unavailable_retries(s, server: str) -> float:
    metrics = (await s.http.get("http://agent/metrics")).text
    for line in metrics.splitlines():
        if line.startswith(f'gym_agent_downstream_unavailable_total{{server="{server}"}}'):
            return float(line.split()[-1])
    return 0.0


async def test_unreachable_servers_are_retried_from_the_boundary(expected) -> None:
    """The resources server, then the model, cannot be reached for a while (restarting): each step is retried
    from its boundary once they are back; nothing runs twice and the result is the uninterrupted one."""
    async with stack(retrying_factory()) as s:
        counter = s.wire.apps.pop("counter")
        first_generation = s.wire.hold(is_call("model", "/v1/responses"))
        started = time.time()
        run = asyncio.create_task(s.run(ROW, ROLLOUT))
        await wait_for(lambda: _at_least(unavailable_retries(s, "resources"), 3), what="three retries of the seed")
        [seed] = (await downstream_report(s)).failing  # what the agent is waiting for, for the collection
        assert (seed.server, seed.path, seed.reason, seed.episodes) == ("resources", "/seed_session", "unreachable", 1)
        assert started <= seed.since <= time.time() and seed.detail.startswith("ConnectError")
        assert seed.describe().startswith("resources /seed_session: unreachable since ")
        s.wire.apps["counter"] = counter
        await asyncio.wait_for(first_generation.arrived.wait(), 10)
        assert (await downstream_report(s)).failing == []  # the seed went through: nothing to wait for
        model = s.wire.apps.pop("model")  # gone before the episode's next generation
        first_generation.release.set()
        await wait_for(lambda: _at_least(unavailable_retries(s, "model"), 3), what="three retries of a generation")
        assert [(f.server, f.path) for f in (await downstream_report(s)).failing] == [("model", "/v1/responses")]
        assert not run.done()
        s.wire.apps["model"] = model
        reply = await asyncio.wait_for(run, 30)
        assert reply.status_code == 200 and reply.json() == expected
        assert counts(s.wire) == {"seed": 1, "generate": 4, "increment": 4, "verify": 1}
        assert (await downstream_report(s)).failing == []


def behind_a_gateway(app: Starlette, path: str, status: int, times: int) -> Starlette:
    """``app`` behind a proxy that answers the first ``times`` calls of ``path`` itself with a bare ``status``
    (a plain-text body, as a load balancer or a Service without ready endpoints does)."""
    left = [times]

    async def gateway(scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] == path and left[0] > 0:
            left[0] -= 1
            await PlainTextResponse("no healthy upstream", status_code=status)(scope, receive, send)
            return
        await app(scope, receive, send)

    return Starlette(routes=[Mount("/", app=gateway)])


async def test_a_proxys_own_503_is_retried_from_the_boundary(expected) -> None:
    """A proxy in front of the resources server answers 503 by itself (no server ready behind it): the call did
    not happen, so the seed is retried from its boundary as for an unreachable server (it was a 502 error row)."""
    async with stack(retrying_factory()) as s:
        s.wire.apps["counter"] = behind_a_gateway(s.wire.apps["counter"], "/seed_session", 503, times=5)
        run = asyncio.create_task(s.run(ROW, ROLLOUT))
        await wait_for(lambda: _at_least(unavailable_retries(s, "resources"), 3), what="three retries of the seed")
        reply = await asyncio.wait_for(run, 30)
        assert reply.status_code == 200 and reply.json() == expected
        assert counts(s.wire) == {"seed": 1, "generate": 4, "increment": 4, "verify": 1}


async def test_a_proxys_own_504_on_a_tool_call_ends_the_attempt_as_unavailable(expected) -> None:
    """A proxy's own 504 on a tool call: the call may have happened behind it, so it is not sent again; the
    attempt ends with 503 upstream_unavailable, which the collection runs again as attempt + 1."""
    async with stack(retrying_factory()) as s:
        s.wire.apps["counter"] = behind_a_gateway(s.wire.apps["counter"], "/increment", 504, times=1)
        reply = await asyncio.wait_for(s.run(ROW, ROLLOUT), 30)
        error = reply.json()["error"]
        assert reply.status_code == 503 and error["code"] == "upstream_unavailable", reply.text
        assert "gateway_504" in error["message"], error
        assert counts(s.wire)["increment"] == 0


async def downstream_report(s) -> DownstreamReport:
    reply = await s.http.get(f"http://agent{DOWNSTREAM_PATH}")
    assert reply.status_code == 200, reply.text
    return DownstreamReport.model_validate_json(reply.content)


async def test_a_server_down_past_the_deadline_fails_the_run_with_503() -> None:
    async with stack(retrying_factory(unavailable_deadline_s=0.3)) as s:
        s.wire.apps.pop("counter")
        reply = await asyncio.wait_for(s.run(ROW, ROLLOUT), 30)
        error = reply.json()["error"]
        assert reply.status_code == 503 and error["code"] == "upstream_unavailable"
        assert error["message"].startswith("gave up after") and "resources /seed_session" in error["message"]


async def _at_least(value, n: float) -> bool:
    return (await value) >= n
