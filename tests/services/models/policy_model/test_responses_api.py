"""Responses <-> chat completions conversion, deterministic output, upstream failures."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from tests.services.models.policy_model.model_support import REQUESTS, ident, model_app, reference, tokens_received
from tests.support.asgi import Control, serve
from tests.support.ports import free_port

from gym_services.base.errors import ApiError
from gym_services.models import tool_markup
from gym_services.models.policy_model.responses import (
    ResponsesRequest,
    build_response,
    chat_body,
    request_digest,
)


def test_input_items_become_chat_messages() -> None:
    request = ResponsesRequest(
        model="m",
        instructions="Be brief.",
        input=[
            {"role": "system", "content": "sys"},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi "}, {"type": "input_text", "text": "there"}],
            },
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Calling."}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": {"b": 2}},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2", "output": {"x": 1}},
            {"role": "developer", "content": "dev"},
        ],
        tools=[{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}],
        tool_choice={"type": "function", "name": "f"},
        parallel_tool_calls=False,
        max_output_tokens=10,
        temperature=0.5,
    )
    body = chat_body(request, "upstream-model")
    assert body["model"] == "upstream-model"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi there"},
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"b": 2}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"x": 1}'},
        {"role": "system", "content": "dev"},
    ]
    assert body["tools"] == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["parallel_tool_calls"] is False and body["temperature"] == 0.5
    assert "max_tokens" not in body  # the generation applies the budget (minus any prefix)


@pytest.mark.parametrize(
    "bad",
    [
        [{"type": "function_call", "name": "f", "arguments": "{}"}],
        [{"type": "image", "url": "x"}],
        [{"role": "robot", "content": "x"}],
        [{"role": "user", "content": 5}],
    ],
)
def test_malformed_input_items_are_400(bad: list) -> None:
    with pytest.raises(ApiError) as caught:
        chat_body(ResponsesRequest(model="m", input=bad), "m")
    assert caught.value.status == 400


def test_digest_ignores_stream_and_nulls_but_not_content() -> None:
    base = {"model": "m", "input": "hello"}
    assert request_digest(ResponsesRequest(**base)) == request_digest(
        ResponsesRequest(**base, stream=False, metadata=None)
    )
    assert request_digest(ResponsesRequest(**base)) != request_digest(ResponsesRequest(model="m", input="hello!"))


def test_output_items_ids_and_incomplete() -> None:
    request = ResponsesRequest(model="m", input="x", max_output_tokens=3)
    text = "Sure.\n" + tool_markup.render("f", {"a": 1}) + tool_markup.render("g", {})
    done = build_response(request, "d" * 64, "m", text, "tool_calls", 5, 7, 0.0)
    assert [item["type"] for item in done["output"]] == ["message", "function_call", "function_call"]
    assert done["output"][0]["content"] == [{"type": "output_text", "text": "Sure.", "annotations": []}]
    assert [json.loads(i["arguments"]) for i in done["output"][1:]] == [{"a": 1}, {}]
    assert len({i["call_id"] for i in done["output"][1:]}) == 2
    assert done == build_response(request, "d" * 64, "m", text, "tool_calls", 5, 7, 0.0)  # deterministic
    assert done["status"] == "completed" and done["incomplete_details"] is None
    assert done["usage"] == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12,
    }
    cut = build_response(request, "d" * 64, "m", "Sure, I will", "length", 5, 3, 0.0)
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut["output"][0]["status"] == "completed"  # the item, as NeMo Gym's vllm_model writes it


async def test_max_output_tokens_is_honoured_across_a_cut(worker, fast_worker) -> None:
    body = {**REQUESTS["lean"], "max_output_tokens": 20}
    expected = await reference(fast_worker.url, body)
    assert expected["status"] == "incomplete" and expected["usage"]["output_tokens"] == 20
    async with serve(model_app(worker.url)) as client:
        call = asyncio.create_task(client.post("/v1/responses", json=body, headers=ident("r-limit")))
        await tokens_received(client, "r-limit", 5)
        await Control(client).prepare("ck-limit")
        await Control(client).resume("ck-limit")
        assert (await asyncio.wait_for(call, 30)).json() == expected


async def test_unreachable_upstream_fails_after_the_retry_deadline_with_503_json() -> None:
    retry = {"deadline_s": 0.6, "backoff_s": 0.05, "backoff_max_s": 0.2}
    app = model_app(f"http://127.0.0.1:{free_port()}", upstream={"connect_timeout_s": 2}, upstream_retry=retry)
    async with serve(app) as client:
        started = time.monotonic()
        resp = await client.post("/v1/responses", json={"model": "workplace-oracle", "input": "hi"})
        assert 0.6 <= time.monotonic() - started < 10  # retried until the deadline, then a clear failure
        error = resp.json()["error"]
        assert resp.status_code == 503 and error["code"] == "upstream_unavailable"
        assert "no progress" in error["message"] and "Cannot connect" in error["message"]
        streamed = await client.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True})
        # a streamed call fails the same way: nothing is streamed before the generation is done
        assert streamed.status_code == 503 and streamed.json()["error"]["code"] == "upstream_unavailable"
        assert streamed.headers["content-type"] == "application/json"
        live = app.state.generations.live_counts()
        assert live["upstream_failures"] >= 4 and live["waiting_for_upstream"] == 0


async def test_unknown_upstream_model_is_502_with_the_upstream_message(fast_worker) -> None:
    async with serve(model_app(fast_worker.url)) as client:
        resp = await client.post("/v1/responses", json={"model": "no-such-policy", "input": "hi"})
    assert resp.status_code == 502 and "model_not_found" in resp.json()["error"]["message"]
