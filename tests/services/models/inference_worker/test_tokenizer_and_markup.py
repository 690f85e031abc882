"""The stand-in tokenizer and the tool-call markup: the properties continuation relies on."""

from __future__ import annotations

import json

import pytest

from gym_services.models import tool_markup
from gym_services.models.inference_worker.tokenizer import count_tokens, split_at, tokenize

SAMPLES = [
    "",
    "Hello, world!",
    "a  b\n\n c\t\td",
    'Action 1 of 2: I will call x.\n<tool_call>{"name": "x", "arguments": {"a": "é ü 東京", "n": 3}}</tool_call>',
    "```lean4\ntheorem t (h₀ : 0 < b ∧ 0 < h) : v = 65 := by\n  sorry\n```",
    "   leading and trailing   ",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_tokens_join_back_and_prefixes_are_stable(text: str) -> None:
    tokens = tokenize(text)
    assert "".join(tokens) == text
    assert count_tokens(text) == len(tokens)
    for k in range(len(tokens) + 1):
        prefix = "".join(tokens[:k])
        assert tokenize(prefix) == tokens[:k], k
        assert split_at(text, prefix) == tokens[k:]


def test_split_inside_a_token_yields_its_rest_first() -> None:
    text = "Hello wonderful world"
    assert split_at(text, "Hello won") == ["derful", " world"]
    assert split_at(text, text) == []
    with pytest.raises(ValueError):
        split_at(text, "Goodbye")


def test_markup_round_trip_and_partial_calls() -> None:
    args = {"email_id": "00000057", "body": "Thanks - ok"}
    text = "I will reply.\n" + tool_markup.render("email_reply_email", json.dumps(args)) + "\n"
    parsed = tool_markup.parse(text)
    assert parsed.content == "I will reply."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("email_reply_email", args)]
    # a cut inside the markup is plain text: nothing is lost, nothing is parsed
    cut = text[: text.index('"body"')]
    assert tool_markup.parse(cut) == tool_markup.Parsed(cut, [])
    # invalid JSON inside the tags stays text too
    broken = "<tool_call>{not json}</tool_call>"
    assert tool_markup.parse(broken) == tool_markup.Parsed(broken, [])
    # string arguments that are not JSON survive as given
    odd = tool_markup.parse(tool_markup.render("f", "not-json"))
    assert odd.tool_calls == [tool_markup.ToolCall("f", "not-json")]
