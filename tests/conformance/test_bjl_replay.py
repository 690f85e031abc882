"""Recorded NeMo Gym rollouts of blackjack and math_formal_lean replayed through our agents and servers.

A scripted model answers each recorded model turn in order (``scripted.py``); the environment is
ours, through its real routes:

- blackjack (``data/example_rollouts.jsonl``, gymnasium_agent): the reference's generator is
  unseeded, so each rollout's cards are read off the recording (the hands in the observations and
  the final ``info``; a busted player's dealer hole card is never shown and any card does) and our
  shoe deals them in the reference's order. Every observation the model sees and every reward and
  ``info`` equal the recording.
- math_formal_lean: ``data/example_rollouts.jsonl`` (simple_agent, one verification each) and
  ``data/multi_turn_*.jsonl`` (proof_refinement_agent, two turns each), the sandbox answering the
  recorded compiler output of each turn (a first turn's output is recovered from its recorded raw
  feedback). Every reward, proof status, feedback, correction prompt and predicted proof equals the
  recording.

What differs in how our agents build the model's inputs is the agents' business: their own conformance suite
(``tests/conformance/test_agents_conformance.py``) compares them with NeMo Gym's agents.
"""

from __future__ import annotations

import contextlib
import json
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_services.base.config import load_config
from gym_services.base.nemo_responses import ResponseObject
from gym_services.resources.blackjack import game
from gym_services.resources.blackjack.app import Config as BlackjackConfig
from gym_services.resources.blackjack.app import create_app as blackjack
from gym_services.resources.math_formal_lean.app import Config as LeanConfig
from gym_services.resources.math_formal_lean.app import create_app as lean
from tests.conformance.oracle.sandbox_script import ScriptedSandbox
from tests.conformance.replay import Replayed, agent_app
from tests.conformance.scripted import ScriptedModel, environment_items, recorded_script, response_object
from tests.services.agents.wire import Wire, running
from tests.support.asgi import base_config

DATA = Path(__file__).resolve().parents[2] / "services" / "gym_services" / "resources" / "math_formal_lean" / "data"
HAND = re.compile(r"Your hand: \[([^\]]*)\] = \d+\nDealer shows: (\S+)\n")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cards(text: str) -> list[str]:
    return [c.strip() for c in text.strip("[]").split(",") if c.strip()]


# --- blackjack ----------------------------------------------------------------------------


def recorded_deck(rollout: dict[str, Any]) -> list[str]:
    """The cards of a recorded game in the reference's deal order."""
    first = HAND.match(rollout["responses_create_params"]["input"][-1]["content"])
    assert first, "the recording starts with the first observation"
    player, up = _cards(first.group(1)), first.group(2)
    info = rollout["info"]
    final = _cards(info["player"])
    assert final[:2] == player
    if info["result"] == "bust":
        return [*player, up, "2", *final[2:]]  # the hole card of a busted player's dealer is never shown
    dealer = _cards(info["dealer"])
    assert dealer[0] == up
    return [*player, dealer[0], dealer[1], *final[2:], *dealer[2:]]


@contextlib.contextmanager
def stacked_shoes(decks: list[list[str]]) -> Iterator[None]:
    """Each new shoe deals the next recorded deck (``random.Random(seed).choice`` replaced)."""

    class Stacked:
        def __init__(self, seed: int) -> None:
            self.cards = list(decks.pop(0))

        def choice(self, ranks: Any) -> str:
            card = self.cards.pop(0)
            assert card in ranks
            return card

    original = game.random
    game.random = types.SimpleNamespace(Random=Stacked)  # type: ignore[assignment]
    try:
        yield
    finally:
        game.random = original


async def replay_script(
    row: dict[str, Any],
    script: list[dict[str, Any]],
    environment: Any,
    agent: str,
    rollout_id: str = "replay-0",
    **overrides: Any,
) -> Replayed:
    model = ScriptedModel({rollout_id: script})
    wire = Wire()
    wire.apps.update({"model": model.app, "env": environment, "agent": agent_app(agent, wire, **overrides)})
    async with running(wire), httpx.AsyncClient(transport=wire, timeout=60) as http:
        reply = await http.post("http://agent/run", json={**row, "_ng_rollout_id": rollout_id, "_ng_attempt_index": 0})
    return Replayed(reply.status_code, reply.json(), model, rollout_id, wire)


def blackjack_rollouts(reference: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    base = reference / "resources_servers/blackjack/data"
    rows = {
        (r["_ng_task_index"], r["_ng_rollout_index"]): r
        for r in _lines(base / "example_rollouts_materialized_inputs.jsonl")
    }
    return [(rows[(r["_ng_task_index"], r["_ng_rollout_index"])], r) for r in _lines(base / "example_rollouts.jsonl")]


@pytest.mark.parametrize("index", range(5))
async def test_blackjack_rollout_replays_with_the_recorded_observations_and_reward(reference, index: int) -> None:
    row, recorded = blackjack_rollouts(reference)[index]
    env = blackjack(load_config(BlackjackConfig, overrides=base_config("env")))
    with stacked_shoes([recorded_deck(recorded)]):
        replayed = await replay_script(row, recorded_script(recorded["response"]), env, "gymnasium_agent", max_steps=5)
    assert replayed.status == 200, replayed.body
    assert replayed.model.remaining(replayed.rollout_id) == 0
    # the first observation, as the model saw it in its first request
    first_request = replayed.model_requests[0]["input"]
    assert first_request[-1]["content"] == recorded["responses_create_params"]["input"][-1]["content"]
    # every later observation, in order
    seen = [(i.get("role"), i.get("content")) for i in replayed.environment_items]
    expected = [(i.get("role"), i.get("content")) for i in environment_items(recorded["response"]["output"])]
    assert seen == expected
    body = replayed.body
    assert (body["reward"], body["terminated"], body["truncated"], body["info"]) == (
        recorded["reward"],
        recorded["terminated"],
        recorded["truncated"],
        recorded["info"],
    )
    steps = replayed.wire.data_calls("env", "/step", ok=True)
    assert [c.reply["reward"] for c in steps][-1] == recorded["reward"]


# --- math_formal_lean ---------------------------------------------------------------------


def lean_env(sandbox: ScriptedSandbox, **config: Any):
    fields = {"sandbox_host": "127.0.0.1", "sandbox_port": 6000, **config}
    return lean(load_config(LeanConfig, overrides=base_config("env", **fields)), sandbox_transport=sandbox.transport)


def task_of(predicted_proof: str) -> dict[str, Any]:
    tasks = _lines(DATA / "example.jsonl") + _lines(DATA / "minif2f_test.jsonl")
    return next(t for t in tasks if f"theorem {t['name']} " in predicted_proof)


def first_turn_output(attempt: dict[str, Any]) -> dict[str, Any]:
    """A failed turn's compiler output, recovered from its recorded raw feedback (stdout, then empty stderr)."""
    feedback = attempt["error_feedback"]
    assert feedback.startswith("Compilation output:\n") and feedback.endswith("\n")
    return {
        "process_status": attempt["proof_status"],
        "stdout": feedback[len("Compilation output:\n") : -1],
        "stderr": "",
    }


@pytest.mark.parametrize("index", range(5))
async def test_lean_rollout_replays_through_the_simple_agent(reference, index: int) -> None:
    recorded = _lines(reference / "resources_servers/math_formal_lean/data/example_rollouts.jsonl")[index]
    task = task_of(recorded["predicted_proof"])
    sandbox = ScriptedSandbox()
    sandbox.load([{"status": 200, "json": recorded["compiler_output"]}])
    replayed = await replay_script(task, recorded_script(recorded["response"]), lean_env(sandbox), "simple_agent")
    assert replayed.status == 200, replayed.body
    verify = replayed.wire.data_calls("env", "/verify", ok=True)[-1].reply
    for key in ("reward", "proof_status", "predicted_proof", "compiler_output"):
        assert verify[key] == recorded[key], key
    assert replayed.body["reward"] == recorded["reward"]
    assert json.loads(sandbox_request(replayed, sandbox)["body"])["generated_code"] == recorded["predicted_proof"]


def sandbox_request(replayed: Replayed, sandbox: ScriptedSandbox) -> dict[str, Any]:
    received = sandbox.take_received()
    assert len(received) == 1
    return received[0]


def multi_turn(reference: Path) -> list[dict[str, Any]]:
    return _lines(DATA / "multi_turn_success_examples.jsonl") + _lines(
        reference / "resources_servers/math_formal_lean/data/multi_turn_full_example.jsonl"
    )


@pytest.mark.parametrize("index", range(3))
async def test_lean_multi_turn_rollout_replays_through_the_proof_refinement_agent(reference, index: int) -> None:
    recorded = multi_turn(reference)[index]
    attempts = recorded["all_attempts"]
    assert [a["turn_index"] for a in attempts] == [0, 1]
    task = task_of(recorded["predicted_proof"])
    row = {
        **{k: task[k] for k in ("header", "formal_statement", "informal_prefix", "name")},
        "responses_create_params": {"input": recorded["responses_create_params"]["input"]},
    }
    first = attempts[0].get("response") or response_object(
        [
            {
                "id": "msg_0",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": attempts[0]["generation"], "annotations": []}],
            }
        ]
    )
    script = [first, recorded_script(recorded["response"])[0]]
    sandbox = ScriptedSandbox()
    sandbox.load(
        [{"status": 200, "json": first_turn_output(attempts[0])}, {"status": 200, "json": recorded["compiler_output"]}]
    )
    replayed = await replay_script(
        row, script, lean_env(sandbox), "proof_refinement_agent", max_correction_turns=2, include_all_attempts=True
    )
    assert replayed.status == 200, replayed.body
    verifications = [c.reply for c in replayed.wire.data_calls("env", "/verify", ok=True)]
    assert len(verifications) == 2
    for ours, theirs in zip(verifications, attempts, strict=False):
        assert (ours["turn_index"], ours["proof_status"], ours["reward"], ours["error_feedback"]) == (
            theirs["turn_index"],
            theirs["proof_status"],
            theirs["reward"],
            theirs["error_feedback"],
        )
        if "correction_prompt" in theirs:
            assert ours["correction_prompt"] == theirs["correction_prompt"]
    final = verifications[-1]
    for key in (
        "reward",
        "proof_status",
        "predicted_proof",
        "compiler_output",
        "needs_correction",
        "error_feedback",
        "correction_prompt",
    ):
        assert final[key] == recorded[key], key
    assert ResponseObject.model_validate(script[1]).output_text() == attempts[1]["generation"]
    # the correction turn's prompt is the first verification's correction prompt
    assert replayed.model_requests[1]["input"][-1]["content"] == verifications[0]["correction_prompt"]
    body = replayed.body
    assert (body["reward"], body["total_turns"]) == (recorded["reward"], recorded["total_turns"])
