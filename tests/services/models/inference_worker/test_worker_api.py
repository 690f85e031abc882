"""The worker's OpenAI-compatible surface: streaming, continuation, limits, errors, pace, accounting."""

from __future__ import annotations

import json
import time

import pytest

from gym_services.models import tool_markup
from gym_services.models.inference_worker.tokenizer import tokenize
from tests.services.models.inference_worker.worker_client import (
    complete,
    complete_stream,
    first_turn_cases,
    parse_sse,
    worker_app,
)
from tests.support.asgi import serve

CASES = first_turn_cases()
CASE_IDS = [f"{policy}-{i}" for i, (policy, _) in enumerate(CASES)]


@pytest.mark.parametrize(("policy", "body"), CASES, ids=CASE_IDS)
async def test_streaming_equals_non_streaming(policy: str, body: dict) -> None:
    async with serve(worker_app()) as client:
        whole = await complete(client, policy, body)
        streamed = await complete_stream(client, policy, body)
    choice = whole["choices"][0]
    assert streamed["id"] == whole["id"]
    assert streamed["message"] == choice["message"]
    assert streamed["finish_reason"] == choice["finish_reason"]
    assert streamed["usage"] == whole["usage"]
    text = choice["message"]["content"]
    assert text and whole["usage"]["completion_tokens"] == len(tokenize(text))
    expected_finish = "tool_calls" if tool_markup.parse(text).tool_calls else "stop"
    assert choice["finish_reason"] == expected_finish
    assert bool(choice["message"].get("tool_calls")) == (expected_finish == "tool_calls")


@pytest.mark.parametrize(("policy", "body"), CASES, ids=CASE_IDS)
async def test_continuation_from_every_third_boundary_equals_uninterrupted(policy: str, body: dict) -> None:
    async with serve(worker_app()) as client:
        whole = await complete(client, policy, body)
        full = whole["choices"][0]["message"]["content"]
        calls = whole["choices"][0]["message"].get("tool_calls")
        tokens = tokenize(full)
        boundaries = sorted({*range(0, len(tokens), 3), len(tokens) - 1, len(tokens)})
        for k in boundaries:
            prefix = "".join(tokens[:k])
            messages = [*body["messages"], {"role": "assistant", "content": prefix}]
            cont_body = {**body, "messages": messages, "continue_final_message": True, "add_generation_prompt": False}
            if k % 2:
                cont = await complete_stream(client, policy, cont_body)
                message, finish, usage = cont["message"], cont["finish_reason"], cont["usage"]
            else:
                cont = await complete(client, policy, cont_body)
                message, finish, usage = cont["choices"][0]["message"], cont["choices"][0]["finish_reason"], cont["usage"]
            assert prefix + message["content"] == full, k
            assert [c["function"] for c in message.get("tool_calls") or []] == [c["function"] for c in calls or []]
            assert finish == whole["choices"][0]["finish_reason"]
            assert usage["completion_tokens"] == len(tokens) - k
            assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"] + k


async def test_continuation_cut_anywhere_inside_tool_call_markup() -> None:
    policy, body = CASES[0]
    async with serve(worker_app()) as client:
        full = (await complete(client, policy, body))["choices"][0]["message"]["content"]
        start = full.index(tool_markup.OPEN)
        for cut in range(start, len(full) + 1, 7):  # character positions, most of them inside a token
            messages = [*body["messages"], {"role": "assistant", "content": full[:cut]}]
            cont = await complete(client, policy, {**body, "messages": messages, "continue_final_message": True})
            message = cont["choices"][0]["message"]
            assert full[:cut] + message["content"] == full
            assert json.loads(message["tool_calls"][0]["function"]["arguments"])


async def test_continuation_of_structured_tool_calls() -> None:
    """An assistant prefix given as structured tool_calls is continued as its markup text."""
    policy, body = CASES[0]
    async with serve(worker_app()) as client:
        whole = (await complete(client, policy, body))["choices"][0]["message"]
        content, call = tool_markup.parse(whole["content"]).content, whole["tool_calls"][0]
        text = whole["content"][: whole["content"].index(tool_markup.OPEN)]
        prefix = {"role": "assistant", "content": text, "tool_calls": [call]}
        cont = await complete(client, policy, {**body, "messages": [*body["messages"], prefix], "continue_final_message": True})
    assert cont["choices"][0]["message"]["content"] == "" and content
    assert cont["choices"][0]["finish_reason"] == "tool_calls"


async def test_refusals() -> None:
    policy, body = CASES[0]
    async with serve(worker_app(models=["workplace-oracle"])) as client:
        wrong = await complete(client, policy, {**body, "messages": [*body["messages"], {"role": "assistant", "content": "Nope"}],
                                                "continue_final_message": True}, expect=400)
        assert wrong["error"]["code"] == "prefix_mismatch"
        unknown = await complete(client, "lean-refine", body, expect=404)
        assert unknown["error"]["code"] == "model_not_found"
        no_assistant = await complete(client, policy, {**body, "continue_final_message": True}, expect=400)
        assert no_assistant["error"]["code"] == "bad_request"
        assert "continue_final_message" in no_assistant["error"]["message"]
        empty = await complete(client, policy, {"messages": []}, expect=400)
        assert empty["error"]["code"] == "bad_request"
        bad_json = await client.post("/v1/chat/completions", content=b"{", headers={"content-type": "application/json"})
        assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "bad_request"
        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["workplace-oracle"]


async def test_max_tokens_stops_with_length_and_continuation_respects_it() -> None:
    policy, body = CASES[0]
    async with serve(worker_app()) as client:
        full = (await complete(client, policy, body))["choices"][0]["message"]["content"]
        cut = await complete(client, policy, {**body, "max_tokens": 5})
        assert cut["choices"][0]["finish_reason"] == "length"
        assert cut["choices"][0]["message"]["content"] == "".join(tokenize(full)[:5])
        assert "tool_calls" not in cut["choices"][0]["message"]
        streamed = await complete_stream(client, policy, {**body, "max_completion_tokens": 5})
        assert streamed["message"]["content"] == cut["choices"][0]["message"]["content"]
        assert streamed["finish_reason"] == "length"


async def test_continuous_usage_on_every_chunk() -> None:
    policy, body = CASES[-1]
    async with serve(worker_app()) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={"model": policy, **body, "stream": True,
                  "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        )
    chunks = [e for e in parse_sse(resp.text) if isinstance(e, dict)]
    emitted = 0
    for chunk in chunks[:-1]:
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            emitted += 1
        assert chunk["usage"]["completion_tokens"] == emitted
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == emitted


async def test_pace_and_token_accounting() -> None:
    policy, body = CASES[-1]
    async with serve(worker_app(tokens_per_second=200, time_to_first_token_s=0.1)) as client:
        started = time.monotonic()
        whole = await complete(client, policy, body)
        elapsed = time.monotonic() - started
        n = whole["usage"]["completion_tokens"]
        assert elapsed >= 0.1 + n / 200 * 0.9, (elapsed, n)
        await complete_stream(client, policy, body)
        stats = (await client.get("/stats")).json()
        assert stats["tokens_generated"] == 2 * n and stats["by_model"] == {policy: 2 * n}
        assert stats["requests"] == 2 and stats["disconnected"] == 0
        assert stats["prompt_tokens"] == 2 * whole["usage"]["prompt_tokens"]
        metrics = (await client.get("/metrics")).text
        assert f'gym_worker_tokens_generated_total{{model="{policy}"}} {float(2 * n)}' in metrics
        # a backend, not a checkpoint participant: no control routes by default
        control = await client.get("/ng-control/v1/checkpoint/status")
        assert control.status_code == 404
