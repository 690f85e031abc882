"""Server-side `Table` output (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`).

kubectl `get` asks for a Table and prints its cells. For custom resources the columns come from the
CRD's `additionalPrinterColumns`, evaluated with a small JSONPath subset; `date` columns are sent
as ages ("5s", "3m2s"), as kube-apiserver does. Built-in kinds get NAME and AGE.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

_TOKEN = re.compile(r'\.([A-Za-z0-9_\-]+)|\[(\d+)\]|\[\*\]|\[\?\(@\.([A-Za-z0-9_.\-]+)\s*==\s*["\']([^"\']*)["\']\)\]')

NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "priority": 0,
    "description": "Name must be unique within a namespace.",
}
AGE_COLUMN = {
    "name": "Age",
    "type": "date",
    "jsonPath": ".metadata.creationTimestamp",
    "priority": 0,
    "description": "CreationTimestamp is a timestamp representing the server time when this object was created.",
}


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Evaluate `.a.b`, `.a[0]`, `.a[*].b` and `.a[?(@.k=="v")].b`; returns every match."""
    expr = path.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    nodes = [obj]
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if not match:
            return []
        pos = match.end()
        key, index, filter_key, filter_value = match.groups()
        following: list[Any] = []
        for node in nodes:
            if key is not None:
                if isinstance(node, dict) and key in node:
                    following.append(node[key])
            elif index is not None:
                if isinstance(node, list) and int(index) < len(node):
                    following.append(node[int(index)])
            elif filter_key is not None:
                for item in node if isinstance(node, list) else []:
                    found = jsonpath(item, "." + filter_key)
                    if found and str(found[0]) == filter_value:
                        following.append(item)
            elif isinstance(node, list):
                following.extend(node)
        nodes = following
    return nodes


def parse_time(value: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except (TypeError, ValueError):
        return None


def human_duration(seconds: float) -> str:
    """The age format of k8s.io/apimachinery's duration.HumanDuration."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    secs = int(seconds)
    if secs < 120:
        return f"{secs}s"
    minutes = secs // 60
    if minutes < 10:
        rest = secs % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    years, days = hours // (24 * 365), (hours // 24) % 365
    if years < 8:
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{years}y"


def _cell(obj: dict[str, Any], column: dict[str, Any], now: datetime.datetime) -> Any:
    values = jsonpath(obj, column.get("jsonPath", ""))
    if not values:
        return None
    value = values[0] if len(values) == 1 else ",".join(str(item) for item in values)
    if column.get("type") == "date":
        moment = parse_time(value) if isinstance(value, str) else None
        return human_duration((now - moment).total_seconds()) if moment else value
    if isinstance(value, (dict, list)):
        return str(value)
    return value


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata", {})}


def build_table(
    objects: list[dict[str, Any]],
    printer_columns: list[dict[str, Any]] | None,
    resource_version: str,
    include_object: str = "Metadata",
) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table; CRDs with printer columns show exactly those after NAME."""
    columns = list(printer_columns) if printer_columns else [AGE_COLUMN]
    now = datetime.datetime.now(tz=datetime.UTC)
    definitions = [NAME_COLUMN] + [
        {
            "name": column["name"],
            "type": column.get("type", "string"),
            "format": column.get("format", ""),
            "description": column.get("description", ""),
            "priority": column.get("priority", 0),
        }
        for column in columns
    ]
    rows = []
    for obj in objects:
        row: dict[str, Any] = {
            "cells": [obj.get("metadata", {}).get("name")] + [_cell(obj, column, now) for column in columns]
        }
        row_object = _row_object(obj, include_object)
        if row_object is not None:
            row["object"] = row_object
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }
