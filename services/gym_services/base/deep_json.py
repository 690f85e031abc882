"""``json.loads`` for text nested deeper than Python 3.11's parser goes, without raising the recursion limit.

The C parser of Python 3.11 recurses once per nesting level and stops at the interpreter's recursion limit (about
1,000 levels) with ``RecursionError``; Python 3.13, which NeMo Gym 0.7.0 runs on, parses far deeper. Where a value
that deep is data a server reads rather than a request body (a model's function-call arguments, a JSON string inside
the body), :func:`loads` answers what ``json.loads`` answers on 3.13: it tries ``json.loads`` and, on
``RecursionError`` only, parses the same text with :func:`loads_iterative`, which keeps its own stack instead of
the C stack. Same values (``NaN``/``Infinity``, the last of duplicate keys, the integer digit limit's ``ValueError``),
and ``json.JSONDecodeError`` for text that is not JSON.
"""

from __future__ import annotations

import json
import json.decoder
import re
from collections.abc import Callable
from typing import Any

#: the string scanner ``json.loads`` uses (C, without recursion); typeshed does not list it
scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]

_SPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?")
_CONSTANTS: dict[str, Any] = {
    "null": None,
    "true": True,
    "false": False,
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
}


def loads(text: str) -> Any:
    """``json.loads(text)``, at any depth (see the module)."""
    try:
        return json.loads(text)
    except RecursionError:
        return loads_iterative(text)


def _scalar(text: str, at: int) -> tuple[Any, int]:
    """A string, number or constant starting at ``at``; the value and where it ends."""
    if text.startswith('"', at):
        return scanstring(text, at + 1, True)
    number = _NUMBER.match(text, at)
    if number is not None and not text.startswith("-Infinity", at):
        integer, fraction, exponent = number.groups()
        if fraction or exponent:
            return float(integer + (fraction or "") + (exponent or "")), number.end()
        return int(integer), number.end()
    for word, value in _CONSTANTS.items():
        if text.startswith(word, at):
            return value, at + len(word)
    raise json.JSONDecodeError("Expecting value", text, at)


def loads_iterative(text: str) -> Any:
    """Parse ``text`` as ``json.loads`` does, with a stack of open containers instead of recursion."""
    # each open container: the list or dict, and for a dict the key whose value comes next
    stack: list[tuple[list[Any] | dict[str, Any], str | None]] = []
    at = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
    while True:
        if text.startswith("{", at) or text.startswith("[", at):
            container: list[Any] | dict[str, Any] = {} if text[at] == "{" else []
            at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
            closing = "}" if isinstance(container, dict) else "]"
            if text.startswith(closing, at):
                value: Any = container
                at += 1
            else:
                key = None
                if isinstance(container, dict):
                    key, at = _key(text, at)
                stack.append((container, key))
                continue
        else:
            value, at = _scalar(text, at)
        # a value is complete: put it into the open containers, closing those it completes
        while True:
            at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
            if not stack:
                if at != len(text):
                    raise json.JSONDecodeError("Extra data", text, at)
                return value
            container, key = stack[-1]
            if isinstance(container, dict):
                assert key is not None
                container[key] = value
            else:
                container.append(value)
            closing = "}" if isinstance(container, dict) else "]"
            if text.startswith(",", at):
                at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
                if isinstance(container, dict):
                    key, at = _key(text, at)
                    stack[-1] = (container, key)
                break
            if not text.startswith(closing, at):
                raise json.JSONDecodeError(f"Expecting ',' delimiter or '{closing}'", text, at)
            stack.pop()
            value, at = container, at + 1


def _key(text: str, at: int) -> tuple[str, int]:
    """An object's key and its colon; where its value starts."""
    if not text.startswith('"', at):
        raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, at)
    key, at = scanstring(text, at + 1, True)
    at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
    if not text.startswith(":", at):
        raise json.JSONDecodeError("Expecting ':' delimiter", text, at)
    return key, _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
