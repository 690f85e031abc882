"""Driving OUR servers the way ``oracle/framework.py`` drives the reference: same calls, same bytes.

A *call* is ``{method?, path, json?}`` (the body sent as ``json.dumps(value)`` with
``content-type: application/json``) or ``{method?, path, raw, content_type?}`` (exact text; no
content type when ``content_type`` is None). A *sequence* is ``{calls, seeds?, until_over?}``
run in one fresh client session (its own cookie jar) against a long-lived app; an answer is
``{status, body, content_type}`` with the body as text, so responses are compared byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette


def request_kwargs(call: dict[str, Any]) -> dict[str, Any]:
    headers = dict(call.get("headers") or {})
    kwargs: dict[str, Any] = {}
    if "raw" in call or "raw_hex" in call:
        raw = call.get("raw")
        kwargs["content"] = (
            bytes.fromhex(call["raw_hex"]) if "raw_hex" in call else (None if raw is None else raw.encode())
        )
        if call.get("content_type") is not None:
            headers["content-type"] = call["content_type"]
    elif "json" in call:
        kwargs["content"] = json.dumps(call["json"]).encode()
        headers.setdefault("content-type", "application/json")
    return {"headers": headers, **kwargs}


def game_over(call: dict[str, Any], answer: dict[str, Any]) -> bool:
    """The same rule as the oracle glue: a 200 ``/step`` with ``terminated`` or ``truncated``."""
    if call.get("path") != "/step" or answer["status"] != 200:
        return False
    body = json.loads(answer["body"])
    return bool(body.get("terminated") or body.get("truncated"))


async def run_sequences(app: Starlette, sequences: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every sequence against ``app`` (its lifespan already running), each with its own cookie jar."""
    results = []
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    for sequence in sequences:
        answers = []
        async with httpx.AsyncClient(transport=transport, base_url="http://ours", timeout=60) as client:
            for call in sequence["calls"]:
                response = await client.request(call.get("method", "POST"), call["path"], **request_kwargs(call))
                answers.append(
                    {
                        "status": response.status_code,
                        "body": response.content.decode("utf-8", errors="replace"),
                        "content_type": response.headers.get("content-type"),
                    }
                )
                if sequence.get("until_over") and game_over(call, answers[-1]):
                    break
        results.append({"answers": answers})
    return results


@dataclass
class Tally:
    """Calls and sequences compared, and every difference with where it was."""

    calls: int = 0
    sequences: int = 0
    equal_sequences: int = 0
    differences: list[dict[str, Any]] = field(default_factory=list)
    allowed: list[dict[str, Any]] = field(default_factory=list)

    def compare(
        self,
        name: str,
        sequences: Sequence[dict[str, Any]],
        ours: Sequence[dict[str, Any]],
        theirs: Sequence[dict[str, Any]],
        allow: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], str | None] = lambda c, o, t: None,
    ) -> None:
        """Compare answer by answer; ``allow(call, ours, theirs)`` names a deliberate difference or None."""
        for index, (sequence, mine, ref) in enumerate(zip(sequences, ours, theirs, strict=True)):
            self.sequences += 1
            equal = True
            length = max(len(mine["answers"]), len(ref["answers"]))
            for step in range(length):
                call = sequence["calls"][step]
                a = mine["answers"][step] if step < len(mine["answers"]) else None
                b = ref["answers"][step] if step < len(ref["answers"]) else None
                self.calls += 1
                if a == b:
                    continue
                equal = False
                where = {"case": name, "sequence": index, "call": step, "path": call["path"], "ours": a, "reference": b}
                reason = allow(call, a or {}, b or {}) if a is not None and b is not None else None
                if reason:
                    self.allowed.append({**where, "allowed": reason})
                else:
                    self.differences.append(where)
            self.equal_sequences += equal

    def summary(self, limit: int = 3) -> str:
        shown = "\n".join(json.dumps(d)[:1500] for d in self.differences[:limit])
        return f"{len(self.differences)} differences in {self.calls} calls:\n{shown}"


#: A known gap (not deliberate), allowed by the servers' suites under this name: where an invalid value sits
#: inside one of the OpenAI SDK's unions (a tool entry or tool choice, an error object, an input item, a
#: function-call output among the output items), NeMo Gym's 422 lists an error for every member of the union,
#: ours for the member the value was meant to be. Same status, same fields of the body blamed.
NESTED_422 = "422 detail inside a union of the SDK's types"


def _blamed(body: str) -> set[tuple]:
    """The fields a 422 blames: the first three elements of every error location (``body``, object, field)."""
    return {tuple(e["loc"][:3]) for e in json.loads(body)["detail"]}


def nested_422(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """Both answers are 422 and blame the same fields of the body (see :data:`NESTED_422`)."""
    if ours.get("status") != 422 or theirs.get("status") != 422:
        return False
    try:
        return _blamed(ours["body"]) == _blamed(theirs["body"])
    except (ValueError, KeyError, TypeError):
        return False
