"""Edge inputs every conformance suite sends: JSON values of every type, deep nesting, lone surrogates, huge integers.

They found differences the ordinary generators missed (nested lists written into table cells, text that
cannot be encoded as UTF-8, bodies nested past the JSON parser, integers past Python's 4,300-digit
conversion limit), so the suites' random generators draw from :func:`edge_value` too, and each suite's
``edge_*`` cases send the named ones.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

#: nested deeper than any Python's JSON parser goes: 400 "There was an error parsing the body" on both sides
TOO_DEEP = 100_000
#: nested deeper than Python 3.11's JSON parser goes (about 1,000 levels) and less deep than 3.13's (about
#: 10,000): the reference (3.13) parses it, our servers (3.11) answer 400; the named gap ``PYTHON_DEPTH``
BETWEEN_PARSERS = 5_000
#: parses on both (3.11 stops near 995 levels inside a server)
SHALLOW = 500
#: a lone surrogate: valid in JSON (``"\ud800"``), a Python str, not encodable as UTF-8
SURROGATE = "\ud800"


@dataclass(frozen=True)
class BigInt:
    """A JSON integer of ``digits`` (Python refuses to convert ints of over 4,300 digits to text, so the suite
    carries them as text and :func:`dumps` writes them as bare numbers)."""

    digits: str


#: an integer of more than 4,300 digits: parsing it raises ValueError in Python >= 3.11 (its conversion limit)
HUGE_INT = BigInt("1" + "0" * 4399 + "7")
_MARK = "\x00bigint\x00"


def dumps(value: Any) -> str:
    """``json.dumps`` that writes :class:`BigInt` values as bare integers."""
    text = json.dumps(value, default=lambda o: _MARK + o.digits if isinstance(o, BigInt) else _unknown(o))
    opening = json.dumps(_MARK)[:-1]  # '"' and the escaped mark
    if opening not in text:
        return text
    head, *parts = text.split(opening)
    return head + "".join(part.replace('"', "", 1) for part in parts)


def _unknown(o: Any) -> Any:
    raise TypeError(f"not JSON: {type(o).__name__}")


#: JSON values of every type, including nested containers, big and odd numbers and odd text
JSON_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    1.5,
    -0.0,
    1e300,
    1e-7,
    2**63,
    -(2**64) - 1,
    "",
    "x",
    "ü—✓",
    "\U0001f600",
    [],
    [1],
    [[1]],
    [[1, 2]],
    [[[1]]],
    [1, 2],
    [1, 2, None],
    [None],
    ["a", "b"],
    [{"a": 1}],
    {},
    {"a": 1},
    {"a": [1, {"b": None}]},
    [[1], [2]],
    [True, 1.5, "s"],
]


def deep_list(depth: int) -> str:
    """``[[[...]]]`` nested ``depth`` levels, as JSON text."""
    return "[" * depth + "]" * depth


def deep_value(depth: int, key: str = "a") -> str:
    """An object whose ``key`` holds a list nested ``depth`` levels, as JSON text."""
    return f'{{"{key}": {deep_list(depth)}}}'


def edge_value(rng: random.Random) -> Any:
    """A JSON value from :data:`JSON_VALUES`, sometimes a lone surrogate, a huge integer or a nested list."""
    r = rng.random()
    if r < 0.1:
        return SURROGATE if rng.random() < 0.5 else "a" + SURROGATE + "b"
    if r < 0.15:
        return HUGE_INT
    if r < 0.25:
        value: Any = rng.choice([1, "x", None])
        for _ in range(rng.randint(1, 70)):
            value = [value]
        return value
    return rng.choice(JSON_VALUES)
