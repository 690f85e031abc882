"""Applying the four PATCH flavours the clients send.

- JSON merge patch (RFC 7386): kubectl `--type=merge`, kopf's status patches, Helm for CRs.
- Strategic merge patch: kubectl apply and Helm 3-way patches of built-in kinds. Emulated as a
  merge patch that drops `$` directives and merges lists of named objects by `name`
  (containers, env, volumes, ports), which is what those clients rely on in practice.
- JSON patch (RFC 6902): kopf's `test` on resourceVersion, finalizer removal.
- Server-side apply: merged like a merge patch (no managedFields, no field removal).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
APPLY_PATCH_CBOR = "application/apply-patch+cbor"
PATCH_TYPES = frozenset({MERGE_PATCH, STRATEGIC_PATCH, JSON_PATCH, APPLY_PATCH})


class PatchTestFailed(ValueError):
    """A JSON-patch `test` operation did not hold, or the patch does not apply."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: dicts merge recursively, `null` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _strip_directives(item) for key, item in value.items() if not key.startswith("$")}
    if isinstance(value, list):
        return [
            _strip_directives(item) for item in value if not (isinstance(item, dict) and item.get("$patch") == "delete")
        ]
    return value


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(item, dict) and "name" in item for item in items)


def _merge_named_lists(target: list[Any], patch: list[Any]) -> list[Any]:
    deleted = {item["name"] for item in patch if item.get("$patch") == "delete"}
    by_name = {item["name"]: item for item in target if item["name"] not in deleted}
    order = [item["name"] for item in target if item["name"] not in deleted]
    for item in patch:
        if item.get("$patch") == "delete":
            continue
        name = item["name"]
        if name not in by_name:
            order.append(name)
        by_name[name] = strategic_merge_patch(by_name.get(name, {}), item)
    return [by_name[name] for name in order]


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A merge patch that understands `$patch: replace|delete` and merges named lists by name."""
    if not isinstance(patch, dict):
        return _strip_directives(copy.deepcopy(patch))
    if patch.get("$patch") == "replace":
        return _strip_directives(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list) and _named(value) and _named(result[key]):
            result[key] = _merge_named_lists(result[key], value)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], operations: Any) -> dict[str, Any]:
    if not isinstance(operations, list):
        raise PatchTestFailed("a JSON patch must be a list of operations")
    try:
        return jsonpatch.apply_patch(target, operations, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise PatchTestFailed(str(exc)) from exc


def apply_patch(content_type: str, target: dict[str, Any], body: Any) -> dict[str, Any]:
    """Dispatch on the request's Content-Type (parameters such as charset ignored)."""
    if content_type == JSON_PATCH:
        return json_patch(target, body)
    if not isinstance(body, dict):
        raise PatchTestFailed("the patch body must be an object")
    if content_type == STRATEGIC_PATCH:
        return strategic_merge_patch(target, body)
    return merge_patch(target, body)
