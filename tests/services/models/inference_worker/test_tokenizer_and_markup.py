"""The stand-in tokenizer and the tool-call markup: the properties continuation relies on."""

from __future__ import annotations

import json

import pytest

from gym_services.models import tool_markup
from gym_services.models.inference_worker import tokenizer
from gym_services.models.inference_worker.tokenizer import (
    CHUNK,
    decode,
    decode_bytes,
    encode,
    encode_rest,
    parse_prompt,
    pieces,
    render_chat,
    token_bytes,
)

SAMPLES = [
    "",
    "Hello, world!",
    "a  b\n\n c\t\td",
    'Action 1 of 2: I will call x.\n<tool_call>{"name": "x", "arguments": {"a": "é ü 東京", "n": 3}}</tool_call>',
    "```lean4\ntheorem t (h₀ : 0 < b ∧ 0 < h) : v = 65 := by\n  sorry\n```",
    "   leading and trailing   ",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_ids_decode_back_to_the_text_and_every_id_is_one_byte_string(text: str) -> None:
    ids = encode(text)
    assert decode(ids) == text
    assert all(1 <= len(token_bytes(t)) <= CHUNK for t in ids)
    assert [tokenizer._chunk_id(token_bytes(t)) for t in ids] == ids


def test_tokens_split_words_and_characters_so_text_does_not_re_tokenize_to_the_same_ids() -> None:
    text = " wonderful 東京"
    ids = encode(text)
    assert len(ids) > len(pieces(text))  # words are split
    cut_in_char = next(
        k for k in range(1, len(ids)) if decode_bytes(ids[:k]).decode("utf-8", "replace").endswith("\ufffd")
    )
    prefix_text = decode_bytes(ids[:cut_in_char]).decode("utf-8", "ignore")
    assert encode(prefix_text) != ids[:cut_in_char]  # the re-tokenized prefix is not what was generated
    # continuing from the bytes tokenizes the rest of the piece on its own
    assert decode_bytes(ids[:cut_in_char] + encode_rest(text, len(decode_bytes(ids[:cut_in_char])))) == text.encode()


def test_the_chat_template_reads_back() -> None:
    turns = [
        ("system", "be brief"),
        ("user", "hi <|im_start|> é"),
        ("assistant", 'x<tool_call>{"name": "f"}</tool_call>'),
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    prompt = render_chat(turns, tools)
    answer = encode("Sure, é")
    parsed = parse_prompt(prompt + answer)
    assert parsed.turns == turns and parsed.tools == tools and parsed.answer_ids == answer
    with pytest.raises(ValueError):
        parse_prompt(encode("no template"))
    with pytest.raises(ValueError):
        token_bytes(tokenizer.VOCAB_SIZE)


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
