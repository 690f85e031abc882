"""``stream: true`` on /v1/responses: synthetic Responses SSE events, cut and resumed like any call."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from tests.services.models.policy_model.model_support import (
    REQUESTS,
    ident,
    model_app,
    reference,
    tokens_received,
    worker_tokens,
)
from tests.support.asgi import Control, serve

from gym_services.models.policy_model.responses import ResponsesRequest, build_response
from gym_services.models.policy_model.stream_events import encode_sse, response_events


def parse_sse(raw: str) -> list[dict[str, Any]]:
    """Frames of ``event:`` + ``data:`` lines; the event name must match the payload's type."""
    events = []
    for frame in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        event = json.loads(lines["data"])
        assert lines["event"] == event["type"]
        events.append(event)
    return events


def rebuilt(events: list[dict[str, Any]]) -> tuple[dict[int, str], dict[int, str]]:
    """Text and arguments per output index, from the deltas alone (what a streaming client sees)."""
    text: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for e in events:
        if e["type"] == "response.output_text.delta":
            text[e["output_index"]] = text.get(e["output_index"], "") + e["delta"]
        if e["type"] == "response.function_call_arguments.delta":
            arguments[e["output_index"]] = arguments.get(e["output_index"], "") + e["delta"]
    return text, arguments


def response_with(text: str, finish: str = "stop") -> dict[str, Any]:
    request = ResponsesRequest(model="m", input="hi")
    return build_response(request, "d" * 64, "m", text, finish, 3, 7, 0.0)


def test_events_of_text_and_calls_rebuild_the_response() -> None:
    text = (
        'Looking.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    )
    response = response_with(text, "tool_calls")
    assert [item["type"] for item in response["output"]] == ["message", "function_call", "function_call"]
    events = parse_sse(encode_sse(response_events(response)).decode())
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == [] and events[1]["type"] == "response.in_progress"
    assert events[-1] == {"type": "response.completed", "response": response, "sequence_number": len(events) - 1}
    texts, arguments = rebuilt(events)
    assert texts == {0: response["output"][0]["content"][0]["text"]}
    assert arguments == {1: response["output"][1]["arguments"], 2: response["output"][2]["arguments"]}
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == response["output"]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1, 2] and all(e["item"]["status"] == "in_progress" for e in added)


def test_cut_off_response_ends_with_incomplete_event() -> None:
    response = response_with("partial answer", "length")
    events = response_events(response)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize("name", ["workplace", "ipi"])
async def test_streamed_call_cut_at_prepare_streams_the_uninterrupted_response(worker, fast_worker, name) -> None:
    body = REQUESTS[name]
    expected = await reference(fast_worker.url, body)
    async with serve(model_app(worker.url)) as client:
        control = Control(client)
        before = await worker_tokens(worker.url)
        call = asyncio.create_task(client.post("/v1/responses", json={**body, "stream": True}, headers=ident("r-sse")))
        await tokens_received(client, "r-sse", 4)
        assert (await control.prepare("ck-sse"))["status"] == "prepared"
        await asyncio.sleep(0.2)
        assert not call.done()  # nothing is sent while the generation is cut
        await control.resume("ck-sse")
        reply = await asyncio.wait_for(call, 30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(reply.text)
    assert events[-1]["type"] == "response.completed" and events[-1]["response"] == expected
    texts, arguments = rebuilt(events)
    for index, item in enumerate(expected["output"]):
        if item["type"] == "message":
            assert texts[index] == item["content"][0]["text"]
        else:
            assert arguments[index] == item["arguments"]
    assert await worker_tokens(worker.url) - before == expected["usage"]["output_tokens"]  # each token once
