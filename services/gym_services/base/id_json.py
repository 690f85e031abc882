"""``json.dumps`` byte for byte, with the token id lists of a value's items written by pydantic-core.

A response's output item, and each earlier item a request carries back, holds its call's ``prompt_token_ids``: a
long context's whole prompt, 8k-32k ids. ``json.dumps`` writes an int by making a ``str`` object of it first (1.8 ms
for 8k ids, the most of what a policy model spent serving thousands of live rollouts: ``benchmarks/RESULTS.md``,
"Where the policy model's event loop goes"); pydantic-core writes the same digits five times faster. Everything else
is written by ``json.dumps`` with the caller's options (its floats, escapes and key order are the reference's), the
id lists as placeholders that the digits then replace: the text is the same, byte for byte.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import pydantic_core

#: the token id fields of an item (its log-probs are floats: written by ``json.dumps``, as the reference writes them)
ID_FIELDS = ("prompt_token_ids", "generation_token_ids")
#: shorter lists are written in place (a placeholder costs more than it saves)
MIN_IDS = 64
#: the bytes the JSON of a list of ints is made of
_INT_LIST_BYTES = b"0123456789-,[]"


def dumps(value: dict[str, Any], items: str, *, sort_keys: bool = False, allow_nan: bool = True) -> bytes:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"), ...).encode()`` (and ``sort_keys``,
    ``allow_nan``), byte for byte; the id lists (:data:`ID_FIELDS`) of the dicts in ``value[items]`` are written by
    pydantic-core. ``value`` is not changed."""
    options: dict[str, Any] = {
        "ensure_ascii": False,
        "separators": (",", ":"),
        "sort_keys": sort_keys,
        "allow_nan": allow_nan,
    }
    listed = value.get(items)
    if not isinstance(listed, list):
        return json.dumps(value, **options).encode()
    mark = secrets.token_hex(8)  # a placeholder no text can hold by chance
    written: list[bytes] = []
    lifted = []
    for item in listed:
        if isinstance(item, dict):
            ids = {name: digits for name in ID_FIELDS if (digits := _ints(item.get(name))) is not None}
            if ids:
                item = {**item, **{name: f"\x00{mark}:{len(written) + n}" for n, name in enumerate(ids)}}
                written.extend(ids.values())
        lifted.append(item)
    text = json.dumps({**value, items: lifted} if written else value, **options).encode()
    for n, digits in enumerate(written):
        text = text.replace(f'"\\u0000{mark}:{n}"'.encode(), digits, 1)
    return text


def _ints(value: Any) -> bytes | None:
    """The JSON of a long list of ints (as ``json.dumps`` writes it: no spaces), else None."""
    if not isinstance(value, list) or len(value) < MIN_IDS:
        return None
    try:
        digits = pydantic_core.to_json(value)
    except pydantic_core.PydanticSerializationError:
        return None
    return digits if not digits.translate(None, _INT_LIST_BYTES) else None
