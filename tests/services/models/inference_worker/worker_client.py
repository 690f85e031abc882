"""Calling the worker's chat completions (JSON and SSE) and building requests from the shipped tasks."""

from __future__ import annotations

import json
from typing import Any

import httpx

from gym_services.base.config import load_config
from gym_services.models import tool_markup
from gym_services.models.inference_worker.app import Config, create_app
from gym_services.models.inference_worker.policies.base import load_tasks


def worker_app(**fields: Any):
    return create_app(load_config(Config, overrides={"name": "inference_worker", **fields}))


def chat_messages(task: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m["content"]} for m in task["responses_create_params"]["input"]]


def chat_tools(task: dict[str, Any]) -> list[dict[str, Any]]:
    tools = task["responses_create_params"].get("tools") or []
    return [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in tools
    ]


def first_turn_cases() -> list[tuple[str, dict[str, Any]]]:
    """(policy, chat request body) for the first turn of every shipped task, plus later turns."""
    cases: list[tuple[str, dict[str, Any]]] = []
    for task in load_tasks("workplace_assistant"):
        cases.append(("workplace-oracle", {"messages": chat_messages(task), "tools": chat_tools(task)}))
    for task in load_tasks("indirect_prompt_injection"):
        for policy in ("ipi-safe", "ipi-follow"):
            cases.append((policy, {"messages": chat_messages(task), "tools": chat_tools(task)}))
    for task in load_tasks("math_formal_lean"):
        cases.append(("lean-refine", {"messages": chat_messages(task)}))
    for task, hand in zip(
        load_tasks("blackjack"),
        [
            "[8, 5] = 13\nDealer shows: A",
            "[A, 7] = 18\nDealer shows: 9",
            "[10, 2] = 12\nDealer shows: 4",
            "[Q, K] = 20\nDealer shows: 10",
            "[3, 4] = 7\nDealer shows: 6",
        ],
        strict=False,  # five hands for the first five example tasks
    ):
        observation = f"Your hand: {hand}\nRespond with <action>hit</action> or <action>stand</action>."
        cases.append(
            ("blackjack-basic", {"messages": [*chat_messages(task), {"role": "user", "content": observation}]})
        )
    return cases


async def complete(client: httpx.AsyncClient, model: str, body: dict[str, Any], expect: int = 200) -> dict[str, Any]:
    resp = await client.post("/v1/chat/completions", json={"model": model, **body})
    assert resp.status_code == expect, resp.text
    return resp.json()


def parse_sse(raw: str) -> list[dict[str, Any] | str]:
    events: list[dict[str, Any] | str] = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def complete_stream(client: httpx.AsyncClient, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """The stream folded into the non-streaming shape (content, tool_calls, finish_reason, usage)."""
    resp = await client.post(
        "/v1/chat/completions",
        json={"model": model, **body, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    content, calls, finish, usage = "", [], None, None
    ids: list[int] = []
    log_probs: list[float] = []
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == chunks[0]["id"]
        if chunk.get("usage") and not chunk["choices"]:
            usage = chunk["usage"]
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            calls += [{k: v for k, v in c.items() if k != "index"} for c in delta.get("tool_calls") or []]
            finish = choice["finish_reason"] or finish
            ids += choice.get("token_ids") or []
            log_probs += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:  # read as a tool-parsing client does: the calls, and the text before them
        message["tool_calls"] = calls
        message["content"] = tool_markup.parse(content).content or None
    return {
        "id": chunks[0]["id"],
        "message": message,
        "finish_reason": finish,
        "usage": usage,
        "prompt_token_ids": chunks[0].get("prompt_token_ids"),
        "token_ids": ids,
        "log_probs": log_probs,
    }


async def continue_ids(
    client: httpx.AsyncClient, model: str, prompt: list[int], stream: bool = False, **fields: Any
) -> dict[str, Any]:
    """``/v1/completions`` from a token-id prompt, as vLLM's adapter asks: text, ids, log-probs, finish."""
    body = {
        "model": model,
        "prompt": prompt,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "stream": stream,
        **fields,
    }
    resp = await client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    if not stream:
        choice = resp.json()["choices"][0]
        ids = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
        assert ids == choice["token_ids"]
        return {
            "text": choice["text"],
            "token_ids": ids,
            "log_probs": choice["logprobs"]["token_logprobs"],
            "prompt_token_ids": choice["prompt_token_ids"],
            "finish_reason": choice["finish_reason"],
        }
    events = parse_sse(resp.text)
    assert events[-1] == "[DONE]"
    out: dict[str, Any] = {
        "text": "",
        "token_ids": [],
        "log_probs": [],
        "prompt_token_ids": None,
        "finish_reason": None,
    }
    for chunk in (e for e in events[:-1] if isinstance(e, dict)):
        assert chunk["object"] == "text_completion"
        for choice in chunk["choices"]:
            out["text"] += choice["text"]
            out["token_ids"] += choice["token_ids"]
            out["log_probs"] += choice["logprobs"]["token_logprobs"]
            assert [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]] == choice["token_ids"]
            out["prompt_token_ids"] = out["prompt_token_ids"] or choice.get("prompt_token_ids")
            out["finish_reason"] = choice["finish_reason"] or out["finish_reason"]
    return out
