"""``base/id_json.py``: ``json.dumps``'s bytes, the token id lists written by pydantic-core."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from typing import Any

import pytest

from gym_services.base import id_json
from gym_services.control.records import canonical_json
from gym_services.models.policy_model.responses import ResponsesRequest, request_digest

RNG = random.Random(7)
PROMPT = [RNG.randrange(0, 151_000) for _ in range(8192)]


def reference(value: Any, sort_keys: bool = False, allow_nan: bool = True) -> bytes:
    """What Starlette's JSONResponse (and ``canonical_json`` with ``sort_keys``) write."""
    return json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys, allow_nan=allow_nan
    ).encode()


def response() -> dict[str, Any]:
    return {
        "id": "resp_1",
        "created_at": 1.5e9,
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": 'héllo \x00 \u2028 "q"'}]},
            {
                "type": "function_call",
                "arguments": '{"a": 1}',
                "prompt_token_ids": PROMPT,
                "generation_token_ids": list(range(2**63, 2**63 + 100)),  # past 64-bit signed
                "generation_log_probs": [-1e-05, -3.25e-07, -0.0, -12.5, -1e16] + [-0.5] * 95,
            },
            {"prompt_token_ids": [True] * 70, "generation_token_ids": [1.0] * 70, "generation_log_probs": []},
            {"prompt_token_ids": [1, 2, 3], "generation_token_ids": PROMPT[:64], "generation_log_probs": []},
            "not an item",
        ],
        "tools": [{"type": "function", "name": "t", "parameters": {"b": 1, "a": [0.1, 1e-07]}}],
        "temperature": 1.0,
    }


@pytest.mark.parametrize("sort_keys", [False, True])
def test_the_bytes_are_json_dumps_bytes(sort_keys: bool) -> None:
    """Long int lists (signed, past 64 bits) by pydantic-core; booleans, floats, short lists, strings with NUL and
    line separators, floats written with exponents, key order: as ``json.dumps`` writes them."""
    value = response()
    before = copy.deepcopy(value)
    assert id_json.dumps(value, "output", sort_keys=sort_keys) == reference(value, sort_keys)
    assert value == before  # not changed


def test_values_without_items_and_not_a_number_are_as_json_dumps_answers() -> None:
    assert id_json.dumps({"output": "text", "x": [1] * 100}, "output") == reference({"output": "text", "x": [1] * 100})
    with pytest.raises(ValueError):
        id_json.dumps({"output": [{"prompt_token_ids": PROMPT}], "t": math.nan}, "output", allow_nan=False)
    assert id_json.dumps({"output": [], "t": math.nan}, "output") == reference({"output": [], "t": math.nan})


def test_a_placeholder_a_text_holds_is_left_as_the_text() -> None:
    """The placeholders carry a random mark per call: text that looks like one is written as text."""
    value = {"output": [{"text": "\x00abcd:0", "prompt_token_ids": PROMPT}, {"text": '"\\u0000x:1"'}]}
    assert id_json.dumps(value, "output") == reference(value)


def test_a_requests_digest_is_the_canonical_jsons() -> None:
    """The policy model's request digest (its ledger's key for a call, kept in checkpoints) did not change."""
    request = ResponsesRequest.model_validate(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "hi"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": "ok",
                    "prompt_token_ids": PROMPT,
                    "generation_token_ids": PROMPT[:100],
                    "generation_log_probs": [-1e-05] * 100,
                },
            ],
            "tools": [{"type": "function", "name": "t"}],
            "temperature": 0.7,
        }
    )
    semantic = request.model_dump(mode="json", exclude_none=True, exclude={"stream"})
    assert request_digest(request) == hashlib.sha256(canonical_json(semantic)).hexdigest()
