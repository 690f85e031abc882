"""The policy model's Responses API through the official ``openai`` client at NeMo Gym 0.7.0's pin (2.44.0).

A real uvicorn policy model process on 127.0.0.1 in front of a real built-in inference worker
process. The SDK is used as NeMo Gym uses it (``AsyncOpenAI(base_url=...).responses.create``), and
on top of the SDK's own (lenient) parsing every answer is validated strictly against the SDK's
types: ``Response.model_validate`` and the ``ResponseStreamEvent`` union, with no field the SDK does
not know (``model_extra`` empty everywhere), so a misspelt or missing field fails here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, get_args

import httpx
import openai
import pytest
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseStreamEvent,
)
from pydantic import BaseModel

from gym_services.models.inference_worker.policies.base import load_tasks
from tests.conformance.agents_compare import value_diffs
from tests.services.models.procs import ServerProcess, running
from tests.support.asgi import TOKEN, base_config

OPENAI_PIN = "2.44.0"
#: every stream event type the SDK knows -> its class (the union is discriminated by ``type``)
EVENTS = {get_args(cls.model_fields["type"].annotation)[0]: cls for cls in get_args(get_args(ResponseStreamEvent)[0])}
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running("inference_worker", {}, tmp_path_factory.mktemp("openai-worker")) as proc:
        yield proc


@pytest.fixture(scope="module")
def model(worker: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = base_config("policy_model", upstream={"base_url": f"{worker.url}/v1"})
    config.pop("name")
    with running("policy_model", config, tmp_path_factory.mktemp("openai-model")) as proc:
        yield proc


@pytest.fixture
async def client(model: ServerProcess):
    async with openai.AsyncOpenAI(base_url=f"{model.url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def no_unknown_fields(value: Any, path: str = "response") -> None:
    """Every SDK object in ``value`` was filled from declared fields only."""
    if isinstance(value, BaseModel):
        assert not value.model_extra, (
            f"{path} ({type(value).__name__}) has fields the SDK does not know: {value.model_extra}"
        )
        for name in type(value).model_fields:
            no_unknown_fields(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            no_unknown_fields(v, f"{path}[{i}]")


def strict_response(raw: Any) -> Response:
    parsed = Response.model_validate(raw)
    no_unknown_fields(parsed)
    return parsed


def workplace_request() -> dict[str, Any]:
    """A shipped Workplace Assistant task as the SDK sends it: function tools, list input."""
    params = load_tasks("workplace_assistant")[3]["responses_create_params"]
    return {"model": "workplace-oracle", "input": params["input"], "tools": params["tools"]}


def test_the_client_is_the_version_nemo_gym_pins() -> None:
    assert openai.__version__ == OPENAI_PIN


async def test_plain_create_with_tools_parses_into_typed_function_calls(client: openai.AsyncOpenAI) -> None:
    raw = await client.responses.with_raw_response.create(**workplace_request())
    assert raw.status_code == 200
    response = raw.parse()
    assert isinstance(response, Response)
    strict = strict_response(json.loads(raw.text))
    assert strict == response
    calls = [item for item in response.output if isinstance(item, ResponseFunctionToolCall)]
    assert calls and all(json.loads(c.arguments) is not None for c in calls)
    assert response.status == "completed" and response.usage is not None and response.usage.total_tokens > 0


async def test_function_call_outputs_fed_back_as_sdk_items_end_in_a_message(client: openai.AsyncOpenAI) -> None:
    """The SDK's own output items, passed back as input with function-call outputs (NeMo Gym's loop)."""
    request = workplace_request()
    items: list[Any] = list(request["input"])
    for _ in range(10):
        response = await client.responses.create(**{**request, "input": items})
        strict_response(response.model_dump(mode="json"))
        calls = [item for item in response.output if isinstance(item, ResponseFunctionToolCall)]
        items += [item.model_dump(exclude_unset=True) for item in response.output]
        if not calls:
            break
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": '{"output":"ok"}'} for c in calls]
    else:
        raise AssertionError("the policy never answered with a message")
    assert isinstance(response.output[-1], ResponseOutputMessage) and response.output_text


async def test_every_request_parameter_of_the_sdk_is_accepted(client: openai.AsyncOpenAI) -> None:
    """Request types: typed content parts, instructions, tool choice and the sampling and bookkeeping fields."""
    response = await client.responses.create(
        model="ipi-safe",
        instructions="Answer briefly.",
        input=[
            {"role": "developer", "content": "You are a helpdesk assistant."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]},
        ],
        tools=[
            {"type": "function", "name": "noop", "parameters": {"type": "object", "properties": {}}, "strict": True}
        ],
        tool_choice="auto",
        parallel_tool_calls=True,
        max_output_tokens=256,
        temperature=0.0,
        top_p=1.0,
        metadata={"task": "t-1"},
        store=False,
        include=["reasoning.encrypted_content"],
        truncation="disabled",
        reasoning={"effort": "low"},
        text={"format": {"type": "text"}},
        user="tester",
        top_logprobs=0,
    )
    strict_response(response.model_dump(mode="json"))
    assert response.status in ("completed", "incomplete")


async def stream_events(client: openai.AsyncOpenAI, request: dict[str, Any]) -> list[Any]:
    events = []
    stream = await client.responses.create(**request, stream=True)
    async with stream:
        async for event in stream:
            events.append(event)
    return events


@pytest.mark.parametrize("kind", ["function calls", "message"])
async def test_streaming_events_are_typed_and_end_with_the_plain_response(
    client: openai.AsyncOpenAI, kind: str
) -> None:
    request = workplace_request()
    if kind == "message":
        request = {
            "model": "lean-refine",
            "input": load_tasks("math_formal_lean")[0]["responses_create_params"]["input"],
        }
    plain = await client.responses.create(**request)
    events = await stream_events(client, request)
    assert events, "no events"
    for event in events:
        assert event.type in EVENTS, f"the SDK knows no event {event.type!r}"
        strict = EVENTS[event.type].model_validate(event.model_dump(mode="json", exclude_unset=True))
        assert type(strict) is type(event), f"{event.type} parsed as {type(event).__name__}"
        no_unknown_fields(event, event.type)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response == plain
    # the SDK's own accumulator rebuilds the same response from the events
    async with client.responses.stream(**request) as manager:
        final = await manager.get_final_response()
    diffs = value_diffs(final.model_dump(mode="json"), plain.model_dump(mode="json"))
    # ``parsed`` and ``parsed_arguments`` (structured-output parsing, ParsedResponse only) are the accumulator's own
    assert [d for d in diffs if not (d[0].endswith((".parsed", ".parsed_arguments")) and d[1] is None)] == []


async def test_an_incomplete_generation_streams_response_incomplete(client: openai.AsyncOpenAI) -> None:
    request = {**workplace_request(), "max_output_tokens": 3}
    plain = await client.responses.create(**request)
    assert plain.status == "incomplete" and plain.incomplete_details is not None
    events = await stream_events(client, request)
    assert events[-1].type == "response.incomplete" and events[-1].response == plain


async def test_a_bad_request_is_the_sdks_bad_request_error(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="workplace-oracle", input=[{"type": "no_such_item"}])
    assert caught.value.status_code == 400 and caught.value.code == "bad_request" and caught.value.message


async def test_a_stale_attempt_is_the_sdks_conflict_error(client: openai.AsyncOpenAI, model: ServerProcess) -> None:
    headers = {"x-ng-rollout-id": "openai-stale", "x-ng-attempt": "1"}
    await client.responses.create(model="ipi-safe", input="hi", extra_headers=headers)
    with pytest.raises(openai.ConflictError) as caught:
        await client.responses.create(model="ipi-safe", input="hi", extra_headers={**headers, "x-ng-attempt": "0"})
    assert caught.value.code == "stale_attempt"


async def test_a_parked_call_is_a_conflict_error_while_a_checkpoint_is_open(
    client: openai.AsyncOpenAI, model: ServerProcess
) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    control = f"{model.url}/ng-control/v1/checkpoint"
    async with httpx.AsyncClient(timeout=30) as http:
        prepared = await http.post(
            f"{control}/prepare", json={"checkpoint_id": "openai-ck", "deadline_s": 5, "lease_s": 30}, headers=auth
        )
        assert prepared.status_code == 200, prepared.text
        try:
            with pytest.raises(openai.ConflictError) as caught:
                await client.responses.create(model="ipi-safe", input="hi")
            assert caught.value.code == "checkpoint_parked"
            with pytest.raises(openai.ConflictError):  # streaming too: refused before any event
                await client.responses.create(model="ipi-safe", input="hi", stream=True)
        finally:
            aborted = await http.post(f"{control}/abort", json={"checkpoint_id": "openai-ck"}, headers=auth)
            assert aborted.status_code == 200, aborted.text
    assert (await client.responses.create(model="ipi-safe", input="hi")).status == "completed"
