"""The worker's OpenAI-compatible surface: streaming, continuation, limits, errors, pace, accounting."""

from __future__ import annotations

import time

import pytest
from tests.services.models.inference_worker.worker_client import (
    complete,
    complete_stream,
    continue_ids,
    first_turn_cases,
    parse_sse,
    worker_app,
)
from tests.support.asgi import serve

from gym_services.models import tool_markup
from gym_services.models.inference_worker.tokenizer import EOS, decode_bytes, encode

CASES = first_turn_cases()
CASE_IDS = [f"{policy}-{i}" for i, (policy, _) in enumerate(CASES)]
TOKEN_INFO = {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True}


def chat_tokens(whole: dict) -> tuple[list[int], list[int], list[float]]:
    """prompt ids, generated ids and log-probs of a non-streaming chat answer asked with TOKEN_INFO."""
    choice = whole["choices"][0]
    ids = [int(e["token"].removeprefix("token_id:")) for e in choice["logprobs"]["content"]]
    assert ids == choice["token_ids"]
    return whole["prompt_token_ids"], ids, [e["logprob"] for e in choice["logprobs"]["content"]]


@pytest.mark.parametrize(("policy", "body"), CASES, ids=CASE_IDS)
async def test_streaming_equals_non_streaming(policy: str, body: dict) -> None:
    async with serve(worker_app()) as client:
        whole = await complete(client, policy, {**body, **TOKEN_INFO})
        streamed = await complete_stream(client, policy, {**body, **TOKEN_INFO})
        tokenized = (await client.post("/tokenize", json={"model": policy, **body})).json()
    choice = whole["choices"][0]
    assert streamed["id"] == whole["id"]
    assert streamed["message"] == choice["message"]
    assert streamed["finish_reason"] == choice["finish_reason"]
    assert streamed["usage"] == whole["usage"]
    prompt, ids, log_probs = chat_tokens(whole)
    assert (streamed["prompt_token_ids"], streamed["token_ids"], streamed["log_probs"]) == (prompt, ids, log_probs)
    assert tokenized["tokens"] == prompt and whole["usage"]["prompt_tokens"] == len(prompt)
    text = decode_bytes(ids[:-1]).decode()
    assert text and ids == [*encode(text), EOS]  # a natural stop generates the EOS token
    # as vLLM with a tool-call parser answers: the parsed calls, and the text before them as content
    assert choice["message"]["content"] == (tool_markup.parse(text).content or None if "<tool_call>" in text else text)
    assert whole["usage"]["completion_tokens"] == len(ids)
    assert all(-10 < lp < 0 for lp in log_probs)
    expected_finish = "tool_calls" if tool_markup.parse(text).tool_calls else "stop"
    assert choice["finish_reason"] == expected_finish
    assert bool(choice["message"].get("tool_calls")) == (expected_finish == "tool_calls")


@pytest.mark.parametrize(("policy", "body"), CASES, ids=CASE_IDS)
async def test_continuation_from_token_ids_equals_uninterrupted_id_for_id(policy: str, body: dict) -> None:
    async with serve(worker_app()) as client:
        whole = await complete(client, policy, {**body, **TOKEN_INFO, "seed": 7, "temperature": 0.8})
        prompt, ids, log_probs = chat_tokens(whole)
        full = decode_bytes(ids[:-1]).decode()
        for k in sorted({*range(0, len(ids), 3), len(ids) - 1}):
            cont = await continue_ids(client, policy, prompt + ids[:k], stream=bool(k % 2), seed=7, temperature=0.8)
            assert cont["prompt_token_ids"] == prompt + ids[:k]
            assert cont["token_ids"] == ids[k:], k
            assert cont["log_probs"] == log_probs[k:], k
            # the text already shown ends before a character the cut split; the continuation completes it
            assert decode_bytes(ids[:k]).decode("utf-8", "ignore") + cont["text"] == full, k
            assert cont["finish_reason"] == "stop"  # the completions route parses no tool calls, like vLLM's


async def test_a_re_tokenized_prefix_is_continued_differently() -> None:
    """What continuing from text does: the same text, other ids, other log-probs."""
    policy, body = next(c for c in CASES if c[0] == "workplace-oracle")
    async with serve(worker_app()) as client:
        prompt, ids, log_probs = chat_tokens(await complete(client, policy, {**body, **TOKEN_INFO}))
        differing = 0
        for k in range(1, len(ids) - 1, 5):
            text = decode_bytes(ids[:k]).decode("utf-8", "ignore")
            if encode(text) == ids[:k]:
                continue
            differing += 1
            cont = await continue_ids(client, policy, prompt + encode(text))
            assert encode(text) + cont["token_ids"] != ids or cont["log_probs"] != log_probs[k:]
        assert differing > 3


async def test_top_logprobs_and_token_names() -> None:
    policy, body = CASES[0]
    async with serve(worker_app()) as client:
        whole = await complete(client, policy, {**body, "logprobs": True, "top_logprobs": 3})
    entries = whole["choices"][0]["logprobs"]["content"]
    assert "prompt_token_ids" not in whole and "token_ids" not in whole["choices"][0]
    text = "".join(bytes(e["bytes"]).decode("utf-8", "replace") for e in entries[:3])
    assert "".join(e["token"] for e in entries[:3]) == text  # plain token names without return_tokens_as_token_ids
    for e in entries:
        assert len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["logprob"] == e["logprob"]
        assert [t["logprob"] for t in e["top_logprobs"]] == sorted(
            (t["logprob"] for t in e["top_logprobs"]), reverse=True
        )


async def test_refusals() -> None:
    policy, body = CASES[0]
    async with serve(worker_app(models=["workplace-oracle"])) as client:
        prompt = (await client.post("/tokenize", json={"model": policy, **body})).json()["tokens"]
        wrong = await client.post("/v1/completions", json={"model": policy, "prompt": prompt + encode("Nope")})
        assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "prefix_mismatch"
        text_prompt = await client.post("/v1/completions", json={"model": policy, "prompt": "hello"})
        assert text_prompt.status_code == 400 and "token-id" in text_prompt.json()["error"]["message"]
        out_of_range = await client.post("/v1/completions", json={"model": policy, "prompt": [*prompt, 10**12]})
        assert out_of_range.status_code == 400
        not_a_chat = await client.post("/v1/completions", json={"model": policy, "prompt": encode("just text")})
        assert not_a_chat.status_code == 400 and not_a_chat.json()["error"]["code"] == "bad_request"
        unknown = await complete(client, "lean-refine", body, expect=404)
        assert unknown["error"]["code"] == "model_not_found"
        messages = [*body["messages"], {"role": "assistant", "content": "I"}]
        text_continuation = await complete(
            client, policy, {**body, "messages": messages, "continue_final_message": True}, expect=400
        )
        assert "token ids" in text_continuation["error"]["message"]
        empty = await complete(client, policy, {"messages": []}, expect=400)
        assert empty["error"]["code"] == "bad_request"
        bad_json = await client.post("/v1/chat/completions", content=b"{", headers={"content-type": "application/json"})
        assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "bad_request"
        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["workplace-oracle"]
        detok = (await client.post("/detokenize", json={"tokens": encode("héllo")})).json()
        assert detok == {"prompt": "héllo"}


async def test_max_tokens_stops_with_length_and_continuation_respects_it() -> None:
    policy, body = CASES[0]
    async with serve(worker_app()) as client:
        prompt, ids, _ = chat_tokens(await complete(client, policy, {**body, **TOKEN_INFO}))
        cut = await complete(client, policy, {**body, "max_tokens": 5})
        assert cut["choices"][0]["finish_reason"] == "length"
        assert cut["choices"][0]["message"]["content"] == decode_bytes(ids[:5]).decode("utf-8", "ignore")
        assert "tool_calls" not in cut["choices"][0]["message"]
        streamed = await complete_stream(client, policy, {**body, "max_completion_tokens": 5})
        assert streamed["message"]["content"] == cut["choices"][0]["message"]["content"]
        assert streamed["finish_reason"] == "length"
        cont = await continue_ids(client, policy, prompt + ids[:5], max_tokens=4)
        assert cont["token_ids"] == ids[5:9] and cont["finish_reason"] == "length"


async def test_continuous_usage_on_every_chunk() -> None:
    policy, body = CASES[-1]
    async with serve(worker_app()) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={
                "model": policy,
                **body,
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
        )
    chunks = [e for e in parse_sse(resp.text) if isinstance(e, dict)]
    emitted = 0
    for chunk in chunks[:-1]:
        if (
            chunk["choices"]
            and chunk["choices"][0]["delta"].get("content") is not None
            and "role" not in chunk["choices"][0]["delta"]
        ):
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
