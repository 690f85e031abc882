"""What an agent's ``/v1/responses`` proxy sends the policy model: the caller's bytes as they are (checked, not kept
parsed while the generation runs), or a string ``input`` as one user message."""

from __future__ import annotations

import json

import pytest

from gym_services.agents.common.service import forwarded_body
from gym_services.base.errors import ApiError


def test_a_body_is_forwarded_as_the_bytes_the_caller_sent() -> None:
    raw = (
        b'{"model": "m",  "input": [{"role": "user", "content": "hi"}, {"type": "function_call_output",'
        b' "call_id": "c", "output": "1.50"}], "prompt_token_ids": [1, 2, 3], "temperature": 1.0e0}'
    )
    assert forwarded_body(raw) is raw  # not parsed and written again: the same object


def test_a_string_input_becomes_one_user_message() -> None:
    sent = forwarded_body(b'{"model": "m", "input": "hello"}')
    assert json.loads(sent) == {"model": "m", "input": [{"role": "user", "content": "hello"}]}


@pytest.mark.parametrize("raw", [b"", b"  ", b"{}"])
def test_an_empty_body_is_an_empty_object(raw: bytes) -> None:
    assert forwarded_body(raw) == b"{}"


@pytest.mark.parametrize(("raw", "why"), [(b"[1, 2]", "must be a JSON object"), (b'{"input": ', "not valid JSON")])
def test_a_body_that_is_not_a_json_object_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(ApiError, match=why) as refused:
        forwarded_body(raw)
    assert refused.value.status == 400
