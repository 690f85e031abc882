"""The scripted-model helpers: splitting recorded rollouts into model turns, and a replay through our agent."""

from __future__ import annotations

import json

import pytest

from tests.conformance.oracle.reference import reference_root
from tests.conformance.replay import replay
from tests.conformance.scripted import (
    Answer,
    ScriptedServer,
    environment_items,
    function_call_outputs,
    model_turns,
    recorded_script,
)

ENVIRONMENTS = ("workplace_assistant", "indirect_prompt_injection", "blackjack", "math_formal_lean")


def recorded(environment: str) -> list[dict]:
    path = reference_root() / "resources_servers" / environment / "data" / "example_rollouts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_model_turns_and_environment_items_partition_every_recorded_output(environment: str) -> None:
    for row in recorded(environment):
        output = row["response"]["output"]
        turns = model_turns(output)
        env = environment_items(output)
        assert turns and all(turns)
        assert sum(len(t) for t in turns) + len(env) == len(output)
        # the model turns alternate with what the environment answered
        script = recorded_script(row["response"])
        assert [r["output"] for r in script] == turns
        assert all(r["id"] != row["response"]["id"] for r in script)


async def test_a_workplace_rollout_replays_through_our_simple_agent_with_the_recorded_tool_outputs() -> None:
    """The recorded tool outputs, scripted as the environment's answers, reach the model unchanged and in order."""
    row = next(r for r in recorded("workplace_assistant") if len(model_turns(r["response"]["output"])) > 1)
    outputs = row["response"]["output"]
    calls = [i for i in outputs if i.get("type") == "function_call"]
    recorded_outputs = function_call_outputs(environment_items(outputs))
    answers: dict[str, list[Answer]] = {"/seed_session": [Answer({})], "/verify": [Answer({"reward": row["reward"]})]}
    for call, out in zip(calls, recorded_outputs, strict=False):
        answers.setdefault(f"/{call['name']}", []).append(Answer(text=out["output"]))
    env = ScriptedServer(answers)
    replayed = await replay({"responses_create_params": row["responses_create_params"]}, row["response"], env.app)
    assert replayed.status == 200, replayed.body
    assert replayed.model.remaining(replayed.rollout_id) == 0
    last_input = replayed.model_requests[-1]["input"]
    assert function_call_outputs(last_input) == recorded_outputs
    assert replayed.body["reward"] == row["reward"]
    assert next(r.path for r in env.received) == "/seed_session"
