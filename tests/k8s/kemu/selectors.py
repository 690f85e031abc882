"""Label and field selectors, as list and watch requests send them.

Helm finds its release Secrets with `owner=helm,name=<release>`, kubectl wait narrows its watch
with `metadata.name=<name>`, the operator lists pods by role labels: ignoring selectors (vanilla
kmock) returns the wrong objects to all of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import bad_request

Predicate = Callable[[dict[str, Any]], bool]

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SET_TERM = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_TERM = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)\s*$")
_EXISTS_TERM = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses: `a in (x,y),b=c` is two terms."""
    terms, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


def _label_term(term: str) -> Callable[[dict[str, str]], bool]:
    if match := _SET_TERM.match(term):
        key, op, raw = match.groups()
        values = {value.strip() for value in raw.split(",") if value.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQ_TERM.match(term):
        key, op, value = match.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS_TERM.match(term):
        negate, key = match.groups()
        if negate:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise bad_request(f"unable to parse requirement: {term!r}")


def label_selector(selector: str | None) -> Predicate:
    """A predicate over whole objects for `=`, `==`, `!=`, `in`, `notin`, `k` and `!k` terms."""
    if not selector:
        return lambda obj: True
    checks = [_label_term(term) for term in _split_terms(selector)]

    def matches(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(check(labels) for check in checks)

    return matches


def _field_value(obj: dict[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def field_selector(selector: str | None) -> Predicate:
    """A predicate for `path=value`, `path==value` and `path!=value` terms over any dotted path."""
    if not selector:
        return lambda obj: True
    checks: list[tuple[str, bool, str]] = []
    for term in _split_terms(selector):
        match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not match:
            raise bad_request(f"invalid field selector: {term!r}")
        path, op, value = match.groups()
        checks.append((path, op == "!=", value))

    def matches(obj: dict[str, Any]) -> bool:
        return all(
            (_field_value(obj, path) != value) if negate else (_field_value(obj, path) == value)
            for path, negate, value in checks
        )

    return matches
