"""``stream: true`` on ``/v1/responses``: a finished response re-emitted as Responses API SSE events.

As NeMo Gym's model servers do, a streaming request is generated in
full first and then re-emitted as synthetic server-sent events. That keeps every checkpoint rule of
the non-streaming path: a cut generation resumes before any byte is sent, a response held during a
checkpoint is emitted at resume, and a restored continuation streams exactly the uninterrupted
response. Event order and fields follow the OpenAI Responses streaming API: ``response.created``,
``response.in_progress``, per output item ``output_item.added`` → deltas → ``…done`` →
``output_item.done``, then ``response.completed`` (or ``response.incomplete``). There is no
``[DONE]`` sentinel in this API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def _in_progress(response: dict[str, Any]) -> dict[str, Any]:
    """The response as it stood before any output: a shallow copy is enough, the lists are replaced."""
    return {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}


def _message_events(item: dict[str, Any], index: int) -> Iterator[dict[str, Any]]:
    yield {
        "type": "response.output_item.added",
        "output_index": index,
        "item": {**item, "status": "in_progress", "content": []},
    }
    for part_index, part in enumerate(item["content"]):
        where = {"item_id": item["id"], "output_index": index, "content_index": part_index}
        yield {"type": "response.content_part.added", **where, "part": {**part, "text": ""}}
        if part["text"]:  # no token log probabilities are reported: the list is empty
            yield {"type": "response.output_text.delta", **where, "delta": part["text"], "logprobs": []}
        yield {"type": "response.output_text.done", **where, "text": part["text"], "logprobs": []}
        yield {"type": "response.content_part.done", **where, "part": part}
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def _function_call_events(item: dict[str, Any], index: int) -> Iterator[dict[str, Any]]:
    yield {
        "type": "response.output_item.added",
        "output_index": index,
        "item": {**item, "status": "in_progress", "arguments": ""},
    }
    where = {"item_id": item["id"], "output_index": index}
    if item["arguments"]:
        yield {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]}
    yield {
        "type": "response.function_call_arguments.done",
        **where,
        "name": item["name"],
        "arguments": item["arguments"],
    }
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def response_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The event sequence for a finished response, numbered by ``sequence_number``."""
    shell = _in_progress(response)  # both opening events carry the same in-progress object; only serialized
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": shell},
        {"type": "response.in_progress", "response": shell},
    ]
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            events.extend(_message_events(item, index))
        elif item["type"] == "function_call":
            events.extend(_function_call_events(item, index))
        else:  # pragma: no cover - build_response makes only these two kinds
            raise ValueError(f"no stream events for output item type {item['type']!r}")
    final = "response.completed" if response["status"] == "completed" else "response.incomplete"
    events.append({"type": final, "response": response})
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


def encode_sse(events: list[dict[str, Any]]) -> bytes:
    """``event:`` + ``data:`` frames, as the OpenAI SDKs parse them."""
    frames = (f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n" for event in events)
    return "".join(frames).encode()
