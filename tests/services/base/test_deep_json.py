"""``deep_json.loads`` answers what ``json.loads`` answers, at depths Python 3.11's parser refuses."""

from __future__ import annotations

import json
import random

import pytest

from gym_services.base.deep_json import loads, loads_iterative

SCALARS = [None, True, False, 0, -1, 1.5, -2e10, 1e-5, "x", "é\u2028", '\\"q', 123456789012345678901234567890, ""]


def _value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 6 or roll < 0.3:
        return rng.choice(SCALARS)
    if roll < 0.65:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice("abcd"): _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def test_the_iterative_parser_reads_what_json_reads() -> None:
    rng = random.Random(1)
    for _ in range(1500):
        value = _value(rng)
        for text in (json.dumps(value), json.dumps(value, indent=2), json.dumps(value, separators=(",", ":"))):
            assert loads_iterative(text) == json.loads(text), text
    for text in ("NaN", "[Infinity,-Infinity]", '{"a":1,"a":2}', " [ 1 , 2 ] ", "-0", "1E5", "0.5e-3"):
        assert repr(loads_iterative(text)) == repr(json.loads(text))


@pytest.mark.parametrize("text", ["", "[", "[1,]", '{"a" 1}', '{"a":1,}', "[1 2]", "nul", "01", "[1]x", "{1:2}", '"ab'])
def test_text_that_is_not_json_is_refused_alike(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        loads_iterative(text)


def test_past_the_recursion_limit() -> None:
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(RecursionError):
        json.loads(deep)
    value, depth = loads(deep), 1
    while value:
        value, depth = value[0], depth + 1
    assert depth == 5000
    assert loads('{"a":' * 3000 + "1" + "}" * 3000)["a"]["a"]["a"] is not None
    with pytest.raises(ValueError, match="digits"):  # the integer digit limit stays an error, as in json.loads
        loads("[" * 3000 + "9" * 5000 + "]" * 3000)
