"""The vLLM adapter: the requests it builds and what it reads (and refuses) of vLLM's chunks."""

from __future__ import annotations

import json
from array import array

import pytest

from gym_services.base.tokens import Tokens
from gym_services.models.policy_model.engines import ENGINES, EngineProtocolError, VllmEngine
from gym_services.models.policy_model.engines.sse import json_body

ENGINE = VllmEngine()
CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0.5,
    "seed": 3,
    "tools": [{"type": "function"}],
}


def test_a_fresh_generation_asks_the_chat_route_for_ids_and_log_probs() -> None:
    request = ENGINE.request(CHAT, None, 10)
    assert request.path == "/chat/completions"
    assert request.body == {
        **CHAT,
        "logprobs": True,
        "top_logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "max_tokens": 10,
    }


def test_a_continuation_sends_prompt_and_prefix_ids_to_completions_with_the_sampling_settings() -> None:
    prefix = Tokens((1, 2, 3), (40, 41), (-0.5, -0.25))
    request = ENGINE.request(CHAT, prefix, 7)
    assert request.path == "/completions"
    # held as a compact array while the stream runs, sent as a JSON list
    assert request.body["prompt"] == array("I", [1, 2, 3, 40, 41])
    assert json.loads(json_body(request.body)) == {
        "model": "m",
        "prompt": [1, 2, 3, 40, 41],
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "temperature": 0.5,
        "seed": 3,
        "max_tokens": 7,
    }
    with pytest.raises(ValueError):
        Tokens((1,), (2, 3), (-1.0,))


def test_chat_and_completion_chunks_are_read_into_ids_and_log_probs() -> None:
    first = ENGINE.parse_chunk(
        {
            "prompt_token_ids": [1, 2],
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            ],
        }
    )
    assert first.prompt_token_ids == array("I", [1, 2]) and not first.has_token
    chat = ENGINE.parse_chunk(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "Hé"},
                    "token_ids": [7],
                    "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.1}]},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1},
        }
    )
    assert (
        chat.text,
        chat.generation_token_ids,
        chat.generation_log_probs,
        chat.finish_reason,
        chat.completion_tokens,
    ) == (
        "Hé",
        [7],
        [-0.1],
        "stop",
        1,
    )
    completion = ENGINE.parse_chunk(
        {
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "prompt_token_ids": [1, 2, 7],
                    "token_ids": [8, 9],
                    "logprobs": {"tokens": ["token_id:8", "token_id:9"], "token_logprobs": [-1, -2.5]},
                    "finish_reason": None,
                }
            ]
        }
    )
    assert (completion.generation_token_ids, completion.generation_log_probs, completion.prompt_token_ids) == (
        [8, 9],
        [-1.0, -2.5],
        array("I", [1, 2, 7]),
    )
    assert completion.has_token  # a token ending inside a character adds no text but is a token


@pytest.mark.parametrize(
    ("chunk", "problem"),
    [
        ({"choices": [{"delta": {"content": "x"}, "logprobs": None}]}, "no token ids"),
        (
            {"choices": [{"delta": {"content": "x"}, "logprobs": {"content": [{"token": "x", "logprob": -1}]}}]},
            "token_id:<id>",
        ),
        (
            {
                "choices": [
                    {"delta": {"content": "x"}, "logprobs": {"content": [{"token": "token_id:1", "logprob": None}]}}
                ]
            },
            "not a number",
        ),
        (
            {
                "choices": [
                    {
                        "delta": {"content": "x"},
                        "token_ids": [2],
                        "logprobs": {"content": [{"token": "token_id:1", "logprob": -1}]},
                    }
                ]
            },
            "disagree",
        ),
        ({"choices": [{"text": "x", "logprobs": {"tokens": ["token_id:1"], "token_logprobs": []}}]}, "token_logprobs"),
        ({"prompt_token_ids": ["a"], "choices": []}, "integer token ids"),
    ],
)
def test_what_the_contract_needs_is_refused_when_missing(chunk: dict, problem: str) -> None:
    with pytest.raises(EngineProtocolError, match=problem):
        ENGINE.parse_chunk(chunk)


def test_the_engine_is_chosen_by_name() -> None:
    from gym_services.models.policy_model.upstream import UpstreamConfig

    assert ENGINES["vllm"] is VllmEngine
    with pytest.raises(ValueError, match="engine 'sglang' is unknown"):
        UpstreamConfig(engine="sglang")


def test_a_training_item_is_read_as_the_item_it_extends() -> None:
    """A resources server reads the text of a response whose items carry token ids (NeMo Gym's ForTraining
    classes are subclasses of the items they extend): the Lean verifier must see the proof."""
    from gym_services.base import nemo_responses

    tokens = {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "theorem t := by simp", "annotations": []}],
    }
    response = {
        "id": "r",
        "object": "response",
        "created_at": 0,
        "model": "m",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "output": [{**message, **tokens}],
    }
    parsed = nemo_responses.ResponseObject.model_validate(response)
    assert parsed.output_text() == parsed.message_text() == "theorem t := by simp"
    assert parsed.output[0]["generation_token_ids"] == [3]  # kept as given
