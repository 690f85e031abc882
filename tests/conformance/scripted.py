"""Scripted servers for conformance tests: a model that answers recorded outputs in order, keyed by rollout.

Used on both sides of a comparison: by our agents in the test process (in process through an
ASGI transport, or served by uvicorn) and by NeMo Gym's reference agents inside the oracle
environment (``tests/conformance/oracle/glue_agents.py``). It therefore imports nothing but the
standard library and Starlette.

- :class:`ScriptedModel` serves ``POST /v1/responses`` (also under any path prefix): each request
  gets the next scripted Responses API object of its rollout (header ``x-ng-rollout-id``; requests
  without it use the ``default`` script). Every request body is recorded per rollout, so a test
  can compare exactly what an agent sent to the model. A request past the end of its script gets
  ``500 script_exhausted``.
- :class:`ScriptedServer` answers any ``POST`` path from per-path queues of scripted answers
  (status, body, cookies) and records every request: a resources or environment server whose
  answers are fixed in advance.
- :func:`model_turns` splits a recorded rollout's ``response.output`` into the outputs of its
  successive model calls; :func:`response_object` wraps one turn into a full Responses API object.

Replaying a recorded rollout through one of our agents with a real environment (in process):
:func:`tests.conformance.replay.replay`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ROLLOUT_HEADER = "x-ng-rollout-id"
DEFAULT = "default"
#: output item types a model produces; anything else in a recorded output came from the environment
MODEL_ITEM_TYPES = frozenset({"message", "reasoning", "function_call"})


def is_model_item(item: Mapping[str, Any]) -> bool:
    """True for items the model generated (assistant messages, reasoning, function calls)."""
    kind = item.get("type", "message")
    if kind not in MODEL_ITEM_TYPES:
        return False
    return kind != "message" or item.get("role", "assistant") == "assistant"


def model_turns(output: Sequence[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """The outputs of successive model calls in a recorded ``response.output``.

    A turn is a maximal run of model items; function-call outputs and user messages (a
    Gymnasium environment's observations) between them are what the environment answered.
    """
    turns: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for item in output:
        if is_model_item(item):
            current.append(dict(item))
        elif current:
            turns.append(current)
            current = []
    if current:
        turns.append(current)
    return turns


def environment_items(output: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The items of a recorded output that the environment produced, in order."""
    return [dict(item) for item in output if not is_model_item(item)]


def function_call_outputs(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``{"call_id", "output"}`` of every function-call output among ``items``, in order."""
    return [
        {"call_id": item.get("call_id"), "output": item.get("output")}
        for item in items
        if item.get("type") == "function_call_output"
    ]


def response_object(
    output: Sequence[Mapping[str, Any]],
    *,
    model: str = "scripted-model",
    response_id: str = "resp_scripted",
    usage: Mapping[str, Any] | None = None,
    incomplete_details: Mapping[str, Any] | None = None,
    envelope: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A complete Responses API ``response`` object holding ``output``.

    ``envelope`` (e.g. a recorded response) supplies the other top-level fields; ``output``,
    ``id``, ``usage`` and ``incomplete_details`` given here replace its own.
    """
    body: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": 1700000000,
        "model": model,
        "status": "incomplete" if incomplete_details else "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": None,
        "parallel_tool_calls": True,
        "temperature": None,
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
    }
    if envelope:
        body.update(envelope)
    body.update(
        {
            "id": response_id,
            "output": [dict(item) for item in output],
            "incomplete_details": dict(incomplete_details) if incomplete_details else None,
            "usage": dict(usage) if usage else None,
        }
    )
    return body


def usage_object(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def recorded_script(recorded_response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The model answers of a recorded rollout: one response object per model turn, in order."""
    envelope = {k: v for k, v in recorded_response.items() if k not in ("output", "usage", "id")}
    return [
        response_object(turn, envelope=envelope, response_id=f"resp_turn_{i}")
        for i, turn in enumerate(model_turns(recorded_response.get("output") or []))
    ]


def rollout_key(row: Mapping[str, Any], index: int) -> str:
    """The rollout id our agents derive from a /run body (``_ng_rollout_id``, else task-rollout), else
    ``line-<index>``."""
    if isinstance(row.get("_ng_rollout_id"), str):
        return row["_ng_rollout_id"]
    if "_ng_task_index" in row and "_ng_rollout_index" in row:
        return f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"
    return f"line-{index}"


@dataclass
class Received:
    """One request a scripted server got."""

    path: str
    body: Any
    headers: dict[str, str]
    cookies: dict[str, str]
    status: int = 0


def _parse(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode("utf-8", "replace")


class ScriptedModel:
    """A Responses API model answering scripted responses in order, per rollout.

    ``scripts`` maps a rollout id (``x-ng-rollout-id``) or ``default`` to its responses.
    ``set_cookies`` are sent with every answer (to see that an agent returns them).
    """

    def __init__(
        self,
        scripts: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        *,
        set_cookies: Mapping[str, str] | None = None,
    ) -> None:
        self.scripts: dict[str, list[dict[str, Any]]] = {k: [dict(r) for r in v] for k, v in (scripts or {}).items()}
        self.served: dict[str, int] = defaultdict(int)
        self.received: dict[str, list[Received]] = defaultdict(list)
        self.set_cookies = dict(set_cookies or {})
        self.app = Starlette(
            routes=[
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/{prefix:path}/v1/responses", self._responses, methods=["POST"]),
            ]
        )

    @classmethod
    def from_rollouts(cls, rollouts: Sequence[Mapping[str, Any]]) -> tuple[ScriptedModel, list[str]]:
        """A model scripted with every recorded rollout's model turns; returns it and the rollout keys in order."""
        keys = [rollout_key(row, i) for i, row in enumerate(rollouts)]
        return cls({key: recorded_script(row["response"]) for key, row in zip(keys, rollouts, strict=True)}), keys

    def script(self, key: str, responses: Sequence[Mapping[str, Any]]) -> None:
        self.scripts[key] = [dict(r) for r in responses]
        self.served[key] = 0

    def requests(self, key: str = DEFAULT) -> list[Any]:
        """The request bodies received for ``key``, in order."""
        return [r.body for r in self.received.get(key, [])]

    def remaining(self, key: str = DEFAULT) -> int:
        return len(self.scripts.get(key, [])) - self.served[key]

    def _key(self, request: Request) -> str:
        key = request.headers.get(ROLLOUT_HEADER)
        if key is None or (key not in self.scripts and DEFAULT in self.scripts):
            return DEFAULT
        return key

    async def _responses(self, request: Request) -> Response:
        key = self._key(request)
        received = Received(
            request.url.path, _parse(await request.body()), dict(request.headers), dict(request.cookies)
        )
        self.received[key].append(received)
        script = self.scripts.get(key, [])
        index = self.served[key]
        if index >= len(script):
            received.status = 500
            message = f"rollout {key!r}: request {index + 1} but the script holds {len(script)} responses"
            return JSONResponse({"error": {"code": "script_exhausted", "message": message}}, status_code=500)
        self.served[key] = index + 1
        received.status = 200
        response = JSONResponse(script[index])
        for name, value in self.set_cookies.items():
            response.set_cookie(name, value)
        return response


@dataclass
class Answer:
    """A scripted reply: a JSON value or raw text body, a status and cookies to set.

    ``echo`` answers the request's own JSON object with ``echo``'s fields added (a verify
    answer: the request plus the reward).
    """

    body: Any = None
    status: int = 200
    text: str | None = None
    cookies: dict[str, str] = field(default_factory=dict)
    echo: dict[str, Any] | None = None

    @classmethod
    def of(cls, value: Any) -> Answer:
        """An Answer from an Answer or a plain dict ``{"body"|"text", "status", "cookies"}``."""
        if isinstance(value, Answer):
            return value
        return cls(
            body=value.get("body"),
            status=int(value.get("status", 200)),
            text=value.get("text"),
            cookies=dict(value.get("cookies") or {}),
            echo=value.get("echo"),
        )

    def response(self, request_body: Any = None) -> Response:
        if self.echo is not None:
            base = request_body if isinstance(request_body, dict) else {}
            response: Response = JSONResponse({**base, **self.echo}, status_code=self.status)
        elif self.text is not None:
            response = Response(self.text, status_code=self.status, media_type="application/json")
        else:
            response = JSONResponse(self.body, status_code=self.status)
        for name, value in self.cookies.items():
            response.set_cookie(name, value)
        return response


class ScriptedServer:
    """Answers ``POST <path>`` from a per-path queue of scripted answers; records every request in order.

    A path with no answer left gets ``500 script_exhausted``.
    """

    def __init__(self, answers: Mapping[str, Sequence[Answer | Mapping[str, Any]]] | None = None) -> None:
        self.answers: dict[str, list[Answer]] = {p: [Answer.of(a) for a in v] for p, v in (answers or {}).items()}
        self.served: dict[str, int] = defaultdict(int)
        self.received: list[Received] = []
        self.app = Starlette(routes=[Route("/{path:path}", self._answer, methods=["POST"])])

    def calls(self, path: str | None = None) -> list[Received]:
        return [r for r in self.received if path is None or r.path == path]

    async def _answer(self, request: Request) -> Response:
        path = request.url.path
        received = Received(path, _parse(await request.body()), dict(request.headers), dict(request.cookies))
        self.received.append(received)
        queue = self.answers.get(path, [])
        index = self.served[path]
        if index >= len(queue):
            received.status = 500
            message = f"{path}: call {index + 1} but the script holds {len(queue)} answers"
            return JSONResponse({"error": {"code": "script_exhausted", "message": message}}, status_code=500)
        self.served[path] = index + 1
        answer = queue[index]
        received.status = answer.status
        return answer.response(received.body)
