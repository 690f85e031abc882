"""NeMo Gym's recorded workplace_assistant rollouts, replayed through our simple_agent + our server.

A scripted policy model answers the k-th generation with the k-th model turn of the recording
(``data/example_rollouts.jsonl`` of the reference wheel). Every ``function_call_output`` the model
is shown must equal the recording byte for byte, the episode's output items must be the recording's,
and the reward must be the recorded one.

The wheel ships no ground truth for these five tasks (they are not in its ``example.jsonl``). For a
rollout recorded with reward 1 the ground truth used is the rollout's own calls (a ground truth that
leaves the same tables); for the one with reward 0 it is the call the task asks for. Either way the
oracle (NeMo Gym's verifier) must give the recorded reward with that ground truth, so the check on
our side is against the reference's own verdict, not only against ours.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.agents.simple_agent.app import Config as SimpleConfig
from gym_services.agents.simple_agent.app import create_app as simple_agent
from gym_services.base.config import ServerConfig, load_config
from gym_services.base.http import read_json
from gym_services.control.admission import RoutePolicy
from gym_services.resources.workplace_assistant.app import Config as WorkplaceConfig
from gym_services.resources.workplace_assistant.app import create_app as workplace
from gym_services.server.app import create_server_app
from tests.conformance.oracle.client import Oracle
from tests.services.agents.fake_model import FakeModelParticipant
from tests.services.agents.stack import stack
from tests.services.agents.wire import Wire
from tests.support.asgi import base_config

#: the call the reward-0 task ("Create a bar chart of total visits since November 30") asks for
BAR_CHART_TRUTH = [
    {
        "name": "analytics_create_plot",
        "arguments": json.dumps(
            {"time_min": "2023-11-30", "time_max": "2023-11-30", "value_to_plot": "total_visits", "plot_type": "bar"}
        ),
    }
]


def load_rollouts(reference) -> list[dict]:
    path = reference / "resources_servers" / "workplace_assistant" / "data" / "example_rollouts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def model_turns(output: list[dict]) -> list[list[dict]]:
    """The recording's output split into model turns (the items between tool results)."""
    turns: list[list[dict]] = [[]]
    for item in output:
        if item.get("type") == "function_call_output":
            if turns[-1]:
                turns.append([])
        else:
            turns[-1].append(item)
    return [t for t in turns if t]


def tool_result_shape(items: list[dict]) -> list[dict]:
    """Items without their null fields: the final output carries every field of an item as NeMo Gym 0.7.0's agent
    writes it (``"namespace": null``, ``"phase": null``, a tool result's ``"id": null, "status": null``), the
    recording was written by an earlier NeMo Gym without some of them; the model requests carry none of them."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return [strip(i) for i in items]


def ground_truth(rollout: dict) -> list[dict]:
    if rollout["reward"] == 1.0:
        return [
            {"name": i["name"], "arguments": i["arguments"]}
            for i in rollout["response"]["output"]
            if i.get("type") == "function_call"
        ]
    assert "bar chart" in rollout["responses_create_params"]["input"][-1]["content"]
    return BAR_CHART_TRUTH


def scripted_model(turns: list[list[dict]], seen: list[dict]):
    """A policy model answering generation k with the recording's k-th model turn."""

    async def responses(request: Request) -> JSONResponse:
        body = await read_json(request)
        seen.append(body)
        k = len(seen) - 1
        output = turns[k] if k < len(turns) else [{"type": "message", "role": "assistant", "content": []}]
        return JSONResponse(
            {
                "id": f"resp_{k}",
                "created_at": 1758499694,
                "object": "response",
                "model": body.get("model"),
                "output": output,
                "incomplete_details": None,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
            }
        )

    config = load_config(ServerConfig, overrides=base_config("model"))
    return create_server_app(
        config,
        FakeModelParticipant(),
        [Route("/v1/responses", responses, methods=["POST"])],
        policies={"/v1/responses": RoutePolicy.GATED_NOWAIT},
    )


def factory(turns: list[list[dict]], seen: list[dict]):
    def make(wire: Wire) -> dict[str, tuple[Any, Any]]:
        agent = load_config(
            SimpleConfig,
            overrides=base_config(
                "agent", model_url="http://model", model="recorded", resources_url="http://resources", max_steps=20
            ),
        )
        return {
            "model": ("model", scripted_model(turns, seen)),
            "agent": ("agent", simple_agent(agent, transport=wire)),
            "resources": ("resources", workplace(load_config(WorkplaceConfig, overrides=base_config("resources")))),
        }

    return make


def test_the_assumed_ground_truths_give_the_recorded_rewards_in_the_reference(oracle: Oracle, reference) -> None:
    rollouts = load_rollouts(reference)
    assert len(rollouts) == 5
    bodies = [
        {
            "responses_create_params": r["responses_create_params"],
            "response": r["response"],
            "ground_truth": ground_truth(r),
            "id": i,
            "category": "workplace_assistant_replay",
            "environment_name": "workplace_assistant",
        }
        for i, r in enumerate(rollouts)
    ]
    got = oracle.call("workplace_assistant", "rewards", bodies)
    assert got == [[200, r["reward"]] for r in rollouts]


@pytest.mark.parametrize("index", range(5))
async def test_recorded_rollout_replays_exactly(reference, index: int) -> None:
    rollout = load_rollouts(reference)[index]
    recorded = rollout["response"]["output"]
    turns = model_turns(recorded)
    row = {
        "id": index,
        "responses_create_params": rollout["responses_create_params"],
        "ground_truth": ground_truth(rollout),
        "category": "workplace_assistant_replay",
        "environment_name": "workplace_assistant",
    }
    seen: list[dict] = []
    async with stack(factory(turns, seen)) as s:
        reply = await s.run(row, f"replay-{index}")
    assert reply.status_code == 200, reply.text
    result = reply.json()
    # what the model saw: its own turns and, after each, the recorded tool results, byte for byte
    assert len(seen) == len(turns)
    recorded_results = [(i["call_id"], i["output"]) for i in recorded if i["type"] == "function_call_output"]
    shown = [(i["call_id"], i["output"]) for i in seen[-1]["input"] if i.get("type") == "function_call_output"]
    assert shown == recorded_results
    for k, request in enumerate(seen):  # each request shows exactly the recording up to that turn
        done = sum(len(t) for t in turns[:k]) + sum(1 for t in turns[:k] for i in t if i["type"] == "function_call")
        shown_items = request["input"][len(rollout["responses_create_params"]["input"]) :]
        assert tool_result_shape(shown_items) == tool_result_shape(recorded[:done])
    assert tool_result_shape(result["response"]["output"]) == tool_result_shape(recorded)
    assert result["reward"] == rollout["reward"]
