"""Deliberate differences from NeMo Gym's indirect_prompt_injection server, as an explicit list.

Each entry is a kind of answer a checkpoint-capable server gives differently on purpose, or an
artefact of the pinned library versions; the server's README explains each. ``allowed(step, ours,
ref)`` returns the label of the entry a differing step falls under, or None (a real difference).
Answers that only a checkpoint produces (``409 checkpoint_parked``, ``409 stale_attempt``) are not
in the conformance runs at all: no checkpoint is open during them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.conformance.http_cases import NESTED_422, nested_422

ALLOWED: dict[str, str] = {
    "bounded environment": (
        "an environment larger than max_environment_bytes (default 1 MB) is refused at /seed_session with "
        "413 payload_too_large: session state is checkpointed, and its size is kept bounded"
    ),
    "bounded repetition": (
        "add_billing_entry computes amount = hours * rate; text or a list repeated into more than 1,000,000 "
        "items fails as MemoryError instead of being stored in the session (NeMo Gym stores it)"
    ),
    NESTED_422: (
        "not deliberate (a known gap): an invalid value inside one of the OpenAI SDK's unions in a verify request is "
        "422 in both, blaming the same fields; NeMo Gym lists an error for every member of the union, ours for one"
    ),
    "pydantic version in error text": (
        "a verify request whose mask_sample/failure_kind/failure_reason has a wrong type is 500 with pydantic's "
        "error text in both; its documentation link names the pydantic version (2.13 in NeMo Gym's lock, 2.14 here)"
    ),
}

_PYDANTIC_URL = re.compile(r"errors\.pydantic\.dev/\d+\.\d+/")


def _repetition_error(body: str) -> bool:
    try:
        return json.loads(body) == {"output": "Error executing tool 'add_billing_entry' (MemoryError): "}
    except ValueError:
        return False


def allowed(step: dict[str, Any], ours: dict[str, Any], ref: dict[str, Any]) -> str | None:
    path = step["path"]
    too_large = '"code":"payload_too_large"' in ours["body"] and "the limit is" in ours["body"]
    if path == "/seed_session" and ours["status"] == 413 and ref["status"] == 200 and too_large:
        return "bounded environment"
    repetition = ours["status"] == ref["status"] == 200 and _repetition_error(ours["body"])
    if path == "/add_billing_entry" and repetition and (ref["env"] != ours["env"] or ref["body"] != ours["body"]):
        return "bounded repetition"
    if path == "/verify" and nested_422(ours, ref) and ours["env"] == ref["env"]:
        return NESTED_422
    same_text = _PYDANTIC_URL.sub("", ours["body"]) == _PYDANTIC_URL.sub("", ref["body"])
    if path == "/verify" and ours["status"] == ref["status"] == 500 and same_text and ours["env"] == ref["env"]:
        return "pydantic version in error text"
    return None
