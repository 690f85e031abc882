"""Which stored call a request continues: the token ledger's lineage resolution (NeMo Gym 0.7.0's
``LineageResolver`` contract, ``nemo_gym/token_id_capture/protocols.py``).

An entry is found again by two hashes of the request that produced it, stamped on the entry when it
is stored (``continuation_fingerprint``, ``continuation_context_len``, ``continuation_context_digest``,
``fingerprint_version``): the **fingerprint** covers the model-authored items of the request plus the
call's own output items (text, tool calls); the **context digest** covers every item of the request the
call answered (roles, text, tool calls, tool results). A later request of the rollout continues that call
when its model-authored items hash to the same fingerprint and its first ``context_len`` items hash to the
same context digest. Both hashes are the layout NeMo Gym's resolver reads (fingerprint version 2: SHA-256
over a domain string, then each field as a tag byte, its UTF-8 length in 8 big-endian bytes and the bytes),
so entries stamped by NeMo Gym's ``token_id_capture`` and by our recording resolve alike.

Never a guess: no candidate, or several with different token sequences, is ``unresolved``; a request with
no model-authored item is a ``root``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from gym_services.models.policy_model.ledger.wire import LedgerEntry, Resolution, ResolutionStatus

FINGERPRINT_VERSION = 2
_FINGERPRINT_DOMAIN = b"nemo-gym-lineage"
_CONTEXT_DOMAIN = b"nemo-gym-lineage-context"
_TEXT_BLOCKS = {"", "text", "input_text", "output_text"}
_TOOL_BLOCKS = {"tool_use", "tool_result"}


class _Hash:
    """SHA-256 over a domain, fed tagged, length-delimited UTF-8 fields."""

    def __init__(self, domain: bytes) -> None:
        self._h = hashlib.sha256(domain)

    def field(self, tag: int, value: str) -> None:
        data = value.encode("utf-8")
        self._h.update(bytes((tag,)) + len(data).to_bytes(8, "big") + data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _json(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"request content is not JSON: {exc}") from None


def _arguments(value: Any) -> str:
    """Tool-call arguments compared as canonical JSON (a harness may reserialize them)."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
        try:
            value = json.loads(text)
        except ValueError:
            return text.strip()
    return _json(value)


def _parts(content: Any) -> Iterable[tuple[str, str]]:
    """(kind, payload) of each content part; tool blocks are read by :func:`_tools` / :func:`_results`."""
    if content is None or content == "":
        return
    if isinstance(content, str):
        yield "text", content
        return
    if not isinstance(content, list):
        raise ValueError(f"message content of type {type(content).__name__}")
    for block in content:
        if isinstance(block, str):
            if block:
                yield "text", block
            continue
        if not isinstance(block, dict):
            raise ValueError(f"content block of type {type(block).__name__}")
        kind = str(block.get("type") or "")
        if kind in _TOOL_BLOCKS:
            continue
        if kind in _TEXT_BLOCKS and isinstance(block.get("text"), str):
            if block["text"]:
                yield "text", block["text"]
            continue
        if not kind:
            raise ValueError("a content block without a type")
        yield kind, _json(block)


def _tools(item: dict[str, Any]) -> Iterable[tuple[str, str, str]]:
    """(call id, name, arguments) of every tool call in an item, in any of the three dialects."""
    if item.get("type") == "function_call":
        name = str(item.get("name", ""))
        if item.get("namespace"):
            name = f"{item['namespace']}__{name}"
        yield str(item.get("call_id") or item.get("id") or ""), name, _arguments(item.get("arguments"))
    if isinstance(item.get("content"), list):
        for block in item["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                yield str(block.get("id") or ""), str(block.get("name", "")), _arguments(block.get("input"))
    for call in item.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        yield str((call or {}).get("id") or ""), str(function.get("name", "")), _arguments(function.get("arguments"))


def _results(item: dict[str, Any]) -> Iterable[tuple[str, str]]:
    """(call id, output) of every tool result in an item."""
    if item.get("type") == "function_call_output":
        output = item.get("output")
        yield str(item.get("call_id") or item.get("id") or ""), output if isinstance(output, str) else _json(output)
    elif item.get("role") == "tool":
        content = item.get("content")
        yield str(item.get("tool_call_id") or ""), content if isinstance(content, str) else _json(content)
    if isinstance(item.get("content"), list):
        for block in item["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                yield (
                    str(block.get("tool_use_id") or block.get("id") or ""),
                    inner if isinstance(inner, str) else _json(inner),
                )


def _items(items: list[Any]) -> list[dict[str, Any]]:
    for item in items:
        if not isinstance(item, dict):
            raise ValueError(f"a request item of type {type(item).__name__}")
    return items


def fingerprint(items: list[Any]) -> str:
    """The model-authored items' hash ("" when there are none: the request starts a chain)."""
    h = _Hash(_FINGERPRINT_DOMAIN)
    authored = 0
    for item in _items(items):
        if item.get("role") != "assistant" and item.get("type") != "function_call":
            continue
        authored += 1
        for kind, payload in _parts(item.get("content")):
            h.field(0, kind)
            h.field(1, payload)
        for call_id, name, arguments in _tools(item):
            h.field(2, call_id)
            h.field(3, name)
            h.field(4, arguments)
    return h.hexdigest() if authored else ""


def context_digest(items: list[Any]) -> str:
    """Every item's hash: who said what, tool calls and their results."""
    h = _Hash(_CONTEXT_DOMAIN)
    for item in _items(items):
        h.field(0, str(item.get("role") or item.get("type") or ""))
        for kind, payload in _parts(item.get("content")):
            h.field(1, kind)
            h.field(2, payload)
        for call_id, name, arguments in _tools(item):
            h.field(3, call_id)
            h.field(4, name)
            h.field(5, arguments)
        for call_id, output in _results(item):
            h.field(6, call_id)
            h.field(7, output)
    return h.hexdigest()


def stamp(entry: LedgerEntry, request_items: list[Any]) -> LedgerEntry:
    """Fill the entry's lookup fields from the request it answered (before it is stored)."""
    entry.continuation_fingerprint = fingerprint([*request_items, *entry.output_items])
    entry.continuation_context_len = len(request_items)
    entry.continuation_context_digest = context_digest(request_items)
    entry.fingerprint_version = FINGERPRINT_VERSION
    return entry


def resolve(entries: Iterable[LedgerEntry], request_items: list[Any]) -> Resolution:
    """The stored call ``request_items`` continues: root, resolved (one call, proven) or unresolved."""
    wanted = fingerprint(request_items)
    if not wanted:
        return Resolution(status=ResolutionStatus.ROOT)
    matches = [
        e
        for e in entries
        if e.continuation_fingerprint == wanted
        and e.fingerprint_version in (None, FINGERPRINT_VERSION)
        and e.continuation_context_digest
        and not getattr(e, "prompt_is_delta", False)  # a delta prompt needs its chain; never guessed
        and len(request_items) >= e.continuation_context_len
        and context_digest(request_items[: e.continuation_context_len]) == e.continuation_context_digest
    ]
    cumulative = {e.model_call_id: list(e.tokens().sequence()) for e in matches}
    if len(matches) > 1 and len({tuple(t) for t in cumulative.values()}) == 1:
        matches = [min(matches, key=lambda e: e.model_call_id)]  # identical token sequences are interchangeable
    if len(matches) != 1:
        return Resolution(status=ResolutionStatus.UNRESOLVED, reason="ambiguous" if matches else "no_match")
    (match,) = matches
    tokens = cumulative[match.model_call_id]
    return Resolution(
        status=ResolutionStatus.RESOLVED,
        model_call_id=match.model_call_id,
        cumulative_token_ids=tokens,
        digest=match.digest or "",
    )
