"""simple_agent against workplace_assistant and indirect_prompt_injection with the real policy model.

Checkpointed with a generation in flight, a tool call in flight (inside the resources
server, and with its reply on the way back), and a ``wait`` verification finishing
during prepare; restored into fresh servers, attempt 1 returns the uninterrupted result
and only the steps after the committed boundary run again.
"""

from __future__ import annotations

import pytest
from tests.services.agents.real import generation_streaming, model_calls, model_totals, simple_stack
from tests.services.agents.stack import agent_blocked, checkpoint_and_continue, stack, uninterrupted, wait_for
from tests.services.agents.wire import Call, Wire
from tests.support.records import records

from gym_services.models.inference_worker.policies.base import load_tasks

WORKPLACE = load_tasks("workplace_assistant")[2]  # three ground-truth tool calls
IPI = load_tasks("indirect_prompt_injection")[0]
_expected: dict[tuple, tuple[dict, dict]] = {}


def tool_calls(wire: Wire) -> list[Call]:
    return [c for c in wire.data_calls("resources", ok=True) if c.path not in ("/seed_session", "/verify")]


def counts(wire: Wire) -> dict[str, int]:
    return {
        "seed": len(wire.data_calls("resources", "/seed_session")),
        "generate": len(model_calls(wire)),
        "tools": len(tool_calls(wire)),
        "verify": len(wire.data_calls("resources", "/verify", ok=True)),
    }


async def expected_of(worker_url: str, environment: str, model: str, row: dict, rollout: str) -> tuple[dict, dict]:
    key = (environment, model, rollout)
    if key not in _expected:
        result, wire = await uninterrupted(simple_stack(worker_url, environment, model), row, rollout)
        _expected[key] = (result, counts(wire))
    return _expected[key]


def outputs_done(call: Call) -> int:
    return sum(1 for item in call.body["input"] if item.get("type") == "function_call_output")


def generation_in_flight(index: int):
    """The generation made after ``index`` tool results is streaming."""
    return generation_streaming(lambda c: c.host == "model" and c.path == "/v1/responses" and outputs_done(c) == index)


def nth_tool(n: int):
    seen = {"count": 0}

    def match(call: Call) -> bool:
        if call.host != "resources" or call.path in ("/seed_session", "/verify"):
            return False
        seen["count"] += 1
        return seen["count"] == n + 1

    return match


# --- workplace_assistant -------------------------------------------------------------


@pytest.fixture
async def workplace_expected(worker):
    result, calls = await expected_of(worker.url, "workplace_assistant", "workplace-oracle", WORKPLACE, "wa-2-0")
    assert result["reward"] == 1.0
    assert calls == {"seed": 1, "generate": 4, "tools": 3, "verify": 1}
    return result


async def test_workplace_generation_in_flight(worker, workplace_expected, tmp_path) -> None:
    factory = simple_stack(worker.url, "workplace_assistant", "workplace-oracle")
    out = await checkpoint_and_continue(
        factory, WORKPLACE, "wa-2-0", f"file://{tmp_path}", arrange=generation_in_flight(1)
    )
    assert out.result == workplace_expected
    assert counts(out.restored_wire) == {"seed": 0, "generate": 3, "tools": 2, "verify": 1}
    assert [outputs_done(c) for c in model_calls(out.restored_wire)] == [1, 2, 3]
    assert model_totals(out.restored_wire.apps["model"])["tokens_reused"] > 0
    assert out.first_run.status_code == 409


async def test_workplace_tool_call_running_in_the_server(worker, workplace_expected, tmp_path) -> None:
    """The tool call is inside workplace_assistant (0.3 s latency) when prepare starts: the agent waits for it."""
    factory = simple_stack(worker.url, "workplace_assistant", "workplace-oracle", tool_latency_s=0.3)

    async def arrange(s):
        sent = s.wire.watch(nth_tool(1))
        return sent.wait

    async def during_prepare(s):
        await wait_for(lambda: agent_blocked(s), what="the agent to report the running tool call")

    out = await checkpoint_and_continue(
        factory, WORKPLACE, "wa-2-0", f"file://{tmp_path}", arrange=arrange, during_prepare=during_prepare
    )
    assert out.result == workplace_expected
    # the second tool call finished before prepare answered: restored state has it, it never runs again
    assert counts(out.restored_wire) == {"seed": 0, "generate": 2, "tools": 1, "verify": 1}
    saved = {p.participant_id: p.episodes for p in out.checkpoint.participants}
    assert saved["resources"] == 1 and saved["agent"] == 1  # the session and the episode of this rollout


async def test_workplace_wait_verification_finishing_during_prepare(worker, workplace_expected, tmp_path) -> None:
    factory = simple_stack(worker.url, "workplace_assistant", "workplace-oracle")

    async def arrange(s):
        hold = s.wire.hold(lambda c: c.host == "resources" and c.path == "/verify")
        return hold.arrived.wait

    async def during_prepare(s):
        await wait_for(lambda: agent_blocked(s), what="the agent to wait for /verify")
        s.wire.holds[0].release.set()

    out = await checkpoint_and_continue(
        factory, WORKPLACE, "wa-2-0", f"file://{tmp_path}", arrange=arrange, during_prepare=during_prepare
    )
    assert out.result == workplace_expected
    assert counts(out.restored_wire) == {"seed": 0, "generate": 0, "tools": 0, "verify": 0}
    assert out.history == ["return"]


async def test_workplace_seed_in_flight_leaves_no_unreachable_session(worker, workplace_expected, tmp_path) -> None:
    """The seed ran in the server but its reply had not reached the agent: the session is saved, the
    boundary is still ``seed``. Attempt 1 seeds again (a replay step) and that seed drops the restored
    session nobody can reach, so after ``/verify`` the server holds nothing of the rollout."""
    factory = simple_stack(worker.url, "workplace_assistant", "workplace-oracle")

    async def arrange(s):
        hold = s.wire.hold(lambda c: c.host == "resources" and c.path == "/seed_session")
        return hold.arrived.wait

    out = await checkpoint_and_continue(factory, WORKPLACE, "wa-2-0", f"file://{tmp_path}", arrange=arrange)
    assert out.result == workplace_expected
    assert {p.participant_id: p.episodes for p in out.checkpoint.participants}["resources"] == 1  # the seeded session
    assert counts(out.restored_wire) == {"seed": 1, "generate": 4, "tools": 3, "verify": 1}
    seed = out.restored_wire.data_calls("resources", "/seed_session")[0]
    assert seed.attempt == 1
    resources = out.restored_wire.apps["resources"].state.participant
    assert resources.sessions == {} and resources.restored == set()


# --- indirect_prompt_injection -------------------------------------------------------


@pytest.mark.parametrize("model", ["ipi-safe", "ipi-follow"])
async def test_ipi_tool_reply_in_flight(worker, model, tmp_path) -> None:
    """The first tool's reply is on its way back when prepare starts: the agent waits for it, then parks."""
    expected, calls = await expected_of(worker.url, "indirect_prompt_injection", model, IPI, f"ipi-0-{model}")
    factory = simple_stack(worker.url, "indirect_prompt_injection", model)

    async def arrange(s):
        hold = s.wire.hold(nth_tool(0))
        return hold.arrived.wait

    async def during_prepare(s):
        await wait_for(lambda: agent_blocked(s), what="the agent to wait for the tool reply")
        s.wire.holds[0].release.set()

    out = await checkpoint_and_continue(
        factory, IPI, f"ipi-0-{model}", f"file://{tmp_path}", arrange=arrange, during_prepare=during_prepare
    )
    assert out.result == expected
    again = counts(out.restored_wire)
    assert again == {
        "seed": 0,
        "generate": calls["generate"] - 1,
        "tools": calls["tools"] - 1,
        "verify": 1,
    }


async def test_ipi_generation_in_flight(worker, tmp_path) -> None:
    expected, calls = await expected_of(worker.url, "indirect_prompt_injection", "ipi-follow", IPI, "ipi-0-ipi-follow")
    assert calls["tools"] == 2  # the required tool, then the injected target tool
    factory = simple_stack(worker.url, "indirect_prompt_injection", "ipi-follow")
    out = await checkpoint_and_continue(
        factory, IPI, "ipi-0-ipi-follow", f"file://{tmp_path}", arrange=generation_in_flight(1)
    )
    assert out.result == expected
    assert counts(out.restored_wire) == {"seed": 0, "generate": calls["generate"] - 1, "tools": 1, "verify": 1}


async def test_run_without_rollout_id_is_refused(worker) -> None:
    async with stack(simple_stack(worker.url, "workplace_assistant", "workplace-oracle")) as s:
        reply = await s.run(WORKPLACE, None)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "rollout_id_required"
        assert s.wire.data_calls("resources") == []


async def test_workplace_generation_reply_in_transit(worker, workplace_expected, tmp_path) -> None:
    """The model finished generation 1 before its prepare, but the reply had not reached the agent at commit.

    The model keeps each rollout's last delivered response until that rollout calls again, and commits
    it: attempt 1 re-issues the generation from its generate boundary (a replay step, docs/participants.md) and the
    restored model answers it from that record without generating a token; the result is exactly equal.
    """
    factory = simple_stack(worker.url, "workplace_assistant", "workplace-oracle")

    async def arrange(s):
        hold = s.wire.hold(lambda c: c.host == "model" and c.status == 200 and outputs_done(c) == 1)
        return hold.arrived.wait

    out = await checkpoint_and_continue(factory, WORKPLACE, "wa-2-0", f"file://{tmp_path}", arrange=arrange)
    assert out.result == workplace_expected
    assert counts(out.restored_wire) == {"seed": 0, "generate": 3, "tools": 2, "verify": 1}
    assert model_totals(out.restored_wire.apps["model"])["tokens_reused"] > 0  # the in-transit reply came back


async def test_workplace_generation_in_flight_with_the_token_ledger(worker, tmp_path) -> None:
    """Token ids on every answer, recorded in the policy model's token ledger: the episode's records name the
    ledger's calls instead of holding their tokens again (``docs/decisions.md``, "The agent's transcript names the
    ledger's tokens"); the restored attempt reads them back from the ledger before its next step and returns the
    uninterrupted answer, every token field included."""
    factory = simple_stack(worker.url, "workplace_assistant", "workplace-oracle", tokens=True)
    expected, _ = await uninterrupted(factory, WORKPLACE, "wa-tokens")
    location = f"file://{tmp_path}"
    out = await checkpoint_and_continue(factory, WORKPLACE, "wa-tokens", location, arrange=generation_in_flight(2))
    assert out.result == expected
    assert "generation_token_ids" in out.result["response"]["output"][-1]
    assert out.restored_wire.data_calls("model")[0].path == "/v1/ledger/tokens"  # before its next step
    (manifest,) = tmp_path.glob("checkpoints/*/participants/agent/manifest.json")
    held = records(location, str(manifest.relative_to(tmp_path)))
    tokens = sum(len(i["prompt_token_ids"]) for i in expected["response"]["output"] if "prompt_token_ids" in i)
    assert sum(map(len, held.values())) < tokens  # less than one byte per token id the answers carried
