"""An episode's checkpoint records (``agents/common/records.py``): each value and each call's tokens written once, a
step costing its new values, and reading the chunks back gives the boundary that was captured."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gym_services.agents.common.records import (
    EPISODE_ENCODER,
    MAX_CHUNKS,
    EpisodeLog,
    FrozenChunk,
    decode_chunks,
    payload,
)
from gym_services.agents.common.tokens import EpisodeTokens, Pending
from gym_services.agents.simple_agent.loop import SimpleBoundary
from gym_services.base.token_arrays import TokenArray
from gym_services.base.tokens import Tokens

TOOLS = [
    {"type": "function", "name": f"tool_{i}", "description": "does a thing " * 20, "parameters": {}} for i in range(8)
]
ROW = {"responses_create_params": {"input": [{"role": "user", "content": "plan it"}], "tools": TOOLS}, "id": 7}


def call(turn: int, context: list[int]) -> dict[str, Any]:
    """A function call item with its call's tokens: the context so far and 200 new ids, 30 generated."""
    prompt = [*context, *range(10_000 + 200 * turn, 10_200 + 200 * turn)]
    generated = list(range(20_000 + 30 * turn, 20_030 + 30 * turn))
    return {
        "type": "function_call",
        "call_id": f"call-{turn}",
        "name": "tool_1",
        "arguments": json.dumps({"turn": turn}),
        "prompt_token_ids": prompt,
        "generation_token_ids": generated,
        "generation_log_probs": [-0.5 - i / 64 for i in range(30)],
    }


def steps(turns: int) -> list[SimpleBoundary]:
    """The boundaries of an episode taking ``turns`` generate + tool turns (the response echoes the tools)."""
    boundary = SimpleBoundary(name="generate", row=ROW, input=ROW["responses_create_params"]["input"])
    out = [boundary]
    context: list[int] = []
    for turn in range(turns):
        item = call(turn, context)
        context = item["prompt_token_ids"] + item["generation_token_ids"]
        response = {"id": f"resp-{turn}", "output": [dict(item)], "tools": TOOLS, "weird": {"$v": 3}}
        boundary = boundary.next("tool", outputs=[*boundary.outputs, item], last_response=response)
        out.append(boundary)
        result = {"call_id": f"call-{turn}", "output": "result " * 30, "type": "function_call_output"}
        boundary = boundary.next("generate", outputs=[*boundary.outputs, result])
        out.append(boundary)
    return out


def captured(log: EpisodeLog, tokens: EpisodeTokens, boundary: SimpleBoundary) -> bytes:
    """One checkpoint of the episode: its new chunk made (as the encoder does after resume) and kept; returns the
    chunk's layout uncompressed (what the sizes below count: each value once, before zlib)."""
    earlier = tuple(log.chunks) if len(log.chunks) < MAX_CHUNKS else ()
    state = FrozenChunk(log, earlier=earlier, boundary=boundary, tokens=tokens, triples=len(tokens))
    data = EPISODE_ENCODER.encode(state)
    EPISODE_ENCODER.encoded(state, data)
    body = payload(data)
    assert len(data) < len(body)  # compressed
    return body


def recorded(tokens: EpisodeTokens, boundary: SimpleBoundary, ledger_calls: bool) -> SimpleBoundary:
    """What an agent records: the boundary with its token lists the episode's arrays (the model named the calls it
    recorded in its ledger when ``ledger_calls``)."""
    for item in boundary.outputs:
        if "prompt_token_ids" in item and isinstance(item["prompt_token_ids"], list):
            fields = (item["prompt_token_ids"], item["generation_token_ids"], item["generation_log_probs"])
            tokens.add(*fields, call=f"digest-{item['call_id']}" if ledger_calls else None)
    tokens.intern(list(boundary.__dict__.values()))
    return boundary


@pytest.mark.parametrize("ledger_calls", [True, False], ids=["ledger", "own tokens"])
def test_each_value_and_token_is_written_once_and_a_step_costs_what_it_added(ledger_calls: bool) -> None:
    tokens, log = EpisodeTokens(), EpisodeLog()
    boundaries, sizes = [], []
    for b in steps(6):  # a checkpoint after every step
        boundaries.append(recorded(tokens, b, ledger_calls))
        sizes.append(len(captured(log, tokens, b)))
    tools = len(json.dumps(TOOLS))
    assert sizes[0] > tools  # the row and its tools
    for turn in range(6):  # a turn: the new item (and its tokens), the response (its tools echo is a reference)
        own = 4 * 200 + 4 * 30 + 4 * 30 if not ledger_calls else 100
        assert sizes[1 + 2 * turn] < 1200 + own, (turn, sizes)
        assert sizes[2 + 2 * turn] < 800, (turn, sizes)
    floor = 4 * (6 * 200 + 6 * 30) + 4 * 6 * 30
    total = sum(sizes)
    assert total < tools + 12 * 1200 + (floor if not ledger_calls else 0) + 2000

    again = EpisodeTokens()
    data = decode_chunks(log.chunks, again)
    restored = SimpleBoundary.model_validate(data)
    if ledger_calls:
        item = restored.outputs[-2]
        assert isinstance(item["prompt_token_ids"], Pending) and again.pending[item["prompt_token_ids"].index]
        read = [(index, tokens.triples[index].tokens()) for index in again.pending]  # what the ledger answers
        again.hydrate(read)
        restored = SimpleBoundary.model_validate(again.substitute(restored.model_dump()))
    assert restored.model_dump(mode="json") == boundaries[-1].model_dump(mode="json")
    assert isinstance(restored.last_response["output"][0]["prompt_token_ids"], TokenArray)
    assert restored.last_response["weird"] == {"$v": 3}  # a value that reads like a reference stays a value


def test_an_episode_past_its_chunk_bound_is_written_whole_once() -> None:
    tokens, log = EpisodeTokens(), EpisodeLog()
    boundaries, sizes = [], []
    for b in steps(MAX_CHUNKS // 2 + 1):
        boundaries.append(recorded(tokens, b, False))
        sizes.append(len(captured(log, tokens, b)))
    assert len(sizes) > MAX_CHUNKS and len(log.chunks) == len(sizes) - MAX_CHUNKS
    assert sizes[MAX_CHUNKS] > sum(sizes[1:MAX_CHUNKS]) / 2  # written whole, every triple again
    restored = SimpleBoundary.model_validate(decode_chunks(log.chunks, EpisodeTokens()))
    assert restored.model_dump(mode="json") == boundaries[-1].model_dump(mode="json")


def test_an_episodes_token_table_holds_each_call_once_sharing_its_context() -> None:
    """Each prompt repeats the conversation before it: the table holds every id once, 4 bytes each."""
    tokens = EpisodeTokens()
    boundaries = [recorded(tokens, b, False) for b in steps(8)]
    assert len(tokens) == 8
    assert tokens.nbytes() == 8 * (200 * 4 + 30 * 4 + 30 * 4)
    last = boundaries[-1]
    assert last.outputs[-2]["prompt_token_ids"] is last.last_response["output"][0]["prompt_token_ids"]
    copied = last.next("verify")  # a boundary's next copies containers, never a token
    assert copied.outputs[-2]["prompt_token_ids"] is last.outputs[-2]["prompt_token_ids"]


@pytest.mark.parametrize(
    "broken",
    [b"", b"\x02", lambda data: data[:-1], lambda data: data + b"x", lambda data: data[:5] + b"\xff" + data[6:]],
)
def test_chunks_that_do_not_read_are_refused(broken) -> None:
    tokens, log = EpisodeTokens(), EpisodeLog()
    for b in steps(1):
        captured(log, tokens, recorded(tokens, b, False))
    chunks = [broken(c) if callable(broken) else broken for c in log.chunks]
    with pytest.raises(ValueError):
        decode_chunks(chunks, EpisodeTokens())


def test_a_triple_written_against_its_predecessor_decodes_exactly() -> None:
    """Own tokens: each call's prompt written against the previous own call's sequence; log-probs that float32
    cannot hold are kept as float64."""
    tokens = EpisodeTokens()
    first = tokens.add([1, 2, 3], [4], [-0.1])
    second = tokens.add([1, 2, 3, 4, 9], [5, 6], [-0.25, -0.5])
    assert second.prompt.base is not None and second.prompt.tail.tolist() == [9]
    assert first.log_probs.typecode == "d" and second.log_probs.typecode == "f"
    assert tokens.add([1, 2, 3], [4], [-0.1]) is first
    assert second.tokens() == Tokens((1, 2, 3, 4, 9), (5, 6), (-0.25, -0.5))
