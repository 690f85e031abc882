"""proof_refinement_agent against math_formal_lean (Lean sandbox stood in) and the real policy model.

Each test runs attempt 0 to one position, checkpoints the whole stack with the
coordinator, retires attempt 0, restores into fresh instances of every server and runs
attempt 1 there: the result equals the uninterrupted one, and the restored stack's
calls show what ran again (seeds, generations by turn, verifications by turn).
"""

from __future__ import annotations

import asyncio

import pytest
from tests.services.agents.real import generation_streaming, model_calls, model_totals, proof_stack
from tests.services.agents.stack import Outcome, agent_blocked, checkpoint_and_continue, stack, uninterrupted, wait_for
from tests.services.agents.wire import Call

from gym_services.base import nemo_responses
from gym_services.control.protocol import VERIFY_HEADER
from gym_services.models.inference_worker.policies.base import load_tasks
from gym_services.resources.math_formal_lean.sandbox_standin import VERIFIED_MARKER

ROW = load_tasks("math_formal_lean")[0]
ROLLOUT = "lean-0-0"
_expected: dict[str, dict] = {}


@pytest.fixture
def factory(worker):
    return proof_stack(worker.url)


@pytest.fixture
async def expected(factory) -> dict:
    if "result" not in _expected:
        result, wire = await uninterrupted(factory, ROW, ROLLOUT)
        _expected["result"] = result
        _expected["generations"] = [turn_of(c, result) for c in model_calls(wire)]
        _expected["verifications"] = [c.body["turn_index"] for c in wire.data_calls("lean", "/verify", ok=True)]
    result = _expected["result"]
    # lean-refine fails its first proof (sorry) and fixes it after the correction prompt
    assert [a["proof_status"] for a in result["all_attempts"]] == ["has_sorry", "completed"]
    assert result["total_turns"] == 2 and result["reward"] == 1.0
    assert _expected["generations"] == [0, 1] and _expected["verifications"] == [0, 1]
    return result


def turn_of(call: Call, result: dict) -> int:
    """Which turn a generation request belongs to (its input is that turn's input, as the attempt records it)."""
    inputs = [nemo_responses.items(a["input"]["input"]) for a in result["all_attempts"]]
    return inputs.index(nemo_responses.items(call.body["input"]))


def reran(out: Outcome) -> dict[str, list]:
    wire = out.restored_wire
    return {
        "seeds": wire.data_calls("lean", "/seed_session"),
        "generations": [turn_of(c, out.result) for c in model_calls(wire)],
        "verifications": [c.body["turn_index"] for c in wire.data_calls("lean", "/verify", ok=True)],
    }


def is_generation(turn: int):
    def match(call: Call) -> bool:
        if call.host != "model" or call.path != "/v1/responses":
            return False
        first = call.body["input"] == ROW["responses_create_params"]["input"]
        return first if turn == 0 else not first

    return match


def generation_in_flight(turn: int):
    return generation_streaming(is_generation(turn))


def sandbox_of(turn: int):
    """The sandbox call compiling turn ``turn``'s proof (turn 0 uses sorry, turn 1 passes)."""

    def match(call: Call) -> bool:
        if call.host != "sandbox":
            return False
        code = call.body["generated_code"]
        return ("sorry" in code) if turn == 0 else (VERIFIED_MARKER in code)

    return match


def verification_in_flight(turn: int, *, mode: str):
    async def arrange(s):
        if mode == "wait":
            s.wire.rewrite_header(lambda c: c.host == "lean" and c.path == "/seed_session", VERIFY_HEADER, "wait")
        hold = s.wire.hold(sandbox_of(turn))
        return hold.arrived.wait

    return arrange


async def release_when_agent_waits(s) -> None:
    await wait_for(lambda: agent_blocked(s), what="the agent to report the waited verification")
    s.wire.holds[0].release.set()


async def test_generation_in_flight(factory, expected, tmp_path) -> None:
    out = await checkpoint_and_continue(factory, ROW, ROLLOUT, f"file://{tmp_path}", arrange=generation_in_flight(0))
    assert out.result == expected
    assert reran(out) == {"seeds": [], "generations": [0, 1], "verifications": [0, 1]}
    fresh = model_totals(out.restored_wire.apps["model"])
    assert fresh["tokens_reused"] > 0  # turn 0 continued from the cut prefix instead of starting over
    assert out.first_run.status_code == 409 and out.retired["agent"] is True
    assert out.agent_status_after_retire["live"]["episodes"] == 0


async def test_replay_verification_in_flight(factory, expected, tmp_path) -> None:
    out = await checkpoint_and_continue(
        factory, ROW, ROLLOUT, f"file://{tmp_path}", arrange=verification_in_flight(0, mode="replay")
    )
    assert out.result == expected
    # the replayable verification of turn 0 runs again; turn 0's proof is not generated again
    assert reran(out) == {"seeds": [], "generations": [1], "verifications": [0, 1]}
    assert out.history[0] == "verify"


async def test_wait_verification_in_flight(factory, expected, tmp_path) -> None:
    out = await checkpoint_and_continue(
        factory,
        ROW,
        ROLLOUT,
        f"file://{tmp_path}",
        arrange=verification_in_flight(0, mode="wait"),
        during_prepare=release_when_agent_waits,
    )
    assert out.result == expected
    # prepare waited for the verification of turn 0: neither it nor its proof runs again
    assert reran(out) == {"seeds": [], "generations": [1], "verifications": [1]}
    assert out.history[0] == "generate"


async def test_correction_generation_in_flight(factory, expected, tmp_path) -> None:
    out = await checkpoint_and_continue(factory, ROW, ROLLOUT, f"file://{tmp_path}", arrange=generation_in_flight(1))
    assert out.result == expected
    assert reran(out) == {"seeds": [], "generations": [1], "verifications": [1]}
    assert model_totals(out.restored_wire.apps["model"])["tokens_reused"] > 0


async def test_final_wait_verification_finishing_during_prepare(factory, expected, tmp_path) -> None:
    out = await checkpoint_and_continue(
        factory,
        ROW,
        ROLLOUT,
        f"file://{tmp_path}",
        arrange=verification_in_flight(1, mode="wait"),
        during_prepare=release_when_agent_waits,
    )
    assert out.result == expected
    assert reran(out) == {"seeds": [], "generations": [], "verifications": []}
    assert out.history == ["return"]


async def test_final_replay_verification_finishing_during_prepare(factory, expected, tmp_path) -> None:
    """A replay verification does not block prepare; it finishes before commit and its `return` boundary is saved."""

    async def arrange(s):
        hold = s.wire.hold(sandbox_of(1))

        async def on_event(phase: str, detail: dict) -> None:
            if phase == "Capturing":  # everyone is prepared; the verification is still held
                assert s.participant.describe(ROLLOUT)["step"] == "verify"
                hold.release.set()
                await wait_for(lambda: (s.participant.describe(ROLLOUT) or {}).get("parked"), what="return boundary")
                assert s.participant.describe(ROLLOUT)["boundary"] == "return"

        s.coordinator.on_event = on_event
        return hold.arrived.wait

    out = await checkpoint_and_continue(factory, ROW, ROLLOUT, f"file://{tmp_path}", arrange=arrange)
    assert out.result == expected
    assert reran(out) == {"seeds": [], "generations": [], "verifications": []}
    assert out.first_run.status_code == 200 and out.first_run.json() == expected  # it had its result at resume


async def test_parked_model_passes_through_and_run_parks(factory, expected) -> None:
    async with stack(factory) as s:
        hold = s.wire.hold(lambda c: c.host == "lean" and c.path == "/seed_session")
        run = asyncio.create_task(s.run(ROW, ROLLOUT))
        await asyncio.wait_for(hold.arrived.wait(), 10)
        model, agent = s.control("model"), s.control("agent")
        assert (await model.prepare("ck-p"))["status"] == "prepared"
        hold.release.set()

        def refused() -> list[Call]:
            return [c for c in s.wire.data_calls("model") if c.status == 409]

        await wait_for(lambda: len(refused()) >= 3, what="refused generations")
        assert {c.reply["error"]["code"] for c in refused()} == {"checkpoint_parked"}
        assert (await agent.prepare("ck-p"))["status"] == "prepared"
        await wait_for(lambda: s.participant.describe(ROLLOUT)["parked"], what="the episode to park")
        seen = len(s.wire.data_calls("model"))
        await asyncio.sleep(0.5)
        assert len(s.wire.data_calls("model")) == seen
        await agent.resume("ck-p")
        await model.resume("ck-p")
        reply = await asyncio.wait_for(run, 30)
        assert reply.status_code == 200 and reply.json() == expected


async def test_run_without_rollout_id_is_refused(factory) -> None:
    async with stack(factory) as s:
        reply = await s.run(ROW, None)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "rollout_id_required"


async def test_at_most_max_correction_turns_plus_one_generations(worker) -> None:
    result, wire = await uninterrupted(proof_stack(worker.url, max_correction_turns=0), ROW, ROLLOUT)
    assert result["total_turns"] == 1 and len(result["all_attempts"]) == 1 and result["reward"] == 0.0
    assert len(model_calls(wire)) == 1
