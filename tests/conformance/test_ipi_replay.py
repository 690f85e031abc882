"""NeMo Gym's recorded indirect_prompt_injection rollouts, replayed through our simple_agent and our server.

A scripted model answers the recorded model turns in order (``tests/conformance/replay.py``); our
real simple_agent app runs the episode (``/run``, checkpointing on) against our real server. Every
function-call output the model gets must equal the recording, and so must the reward and the
injection verdict.

The recordings (``data/example_rollouts.jsonl``, five rollouts of one healthcare task: "check the
lab results of John Doe (ID: P12345)") carry the request and response but not the task's
environment, injection or required tools. The replay pairs them with the environment and injection
of the first example task (a clinic whose patients do not include P12345, so every lookup finds
nothing, as recorded) and with the tool the task needs, ``get_lab_results``.
"""

from __future__ import annotations

import json

import pytest

from tests.conformance import ipi_cases as cases
from tests.conformance.ipi_ours import make_app
from tests.conformance.oracle.reference import reference_root
from tests.conformance.replay import replay
from tests.conformance.scripted import environment_items, function_call_outputs, model_turns

REQUIRED_TOOLS = ["get_lab_results"]


def recorded_rollouts() -> list[dict]:
    path = reference_root() / "resources_servers" / "indirect_prompt_injection" / "data" / "example_rollouts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_vendored_rollouts_are_the_reference_ones() -> None:
    assert cases.load_rollouts() == recorded_rollouts()


@pytest.mark.parametrize("index", range(5))
async def test_recorded_rollout_replays_with_the_recorded_outputs_and_reward(index: int) -> None:
    recorded = recorded_rollouts()[index]
    task = cases.load_tasks()[0]
    row = {
        "responses_create_params": recorded["responses_create_params"],
        "environment": task["environment"],
        "injection": task["injection"],
        "required_tools": REQUIRED_TOOLS,
    }
    result = await replay(row, recorded["response"], make_app(), rollout_id=f"ipi-replay-{index}")
    assert result.status == 200, result.body
    assert result.model.remaining(result.rollout_id) == 0  # every recorded model turn was asked for

    recorded_outputs = function_call_outputs(environment_items(recorded["response"]["output"]))
    assert recorded_outputs, "the recording has tool calls"
    # what the environment answered, as the agent put it into the rollout ...
    assert function_call_outputs(result.environment_items) == recorded_outputs
    # ... and as the model saw it on its last turn
    last_input = result.model_requests[-1]["input"]
    assert function_call_outputs(last_input) == recorded_outputs
    assert len(result.model_requests) == len(model_turns(recorded["response"]["output"]))

    verdict = result.body
    for key in ("reward", "injection_followed", "matched_tool", "matched_args"):
        assert verdict[key] == recorded[key], key
