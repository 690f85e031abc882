"""Helpers shared by the toolkits: errors, validation, paging, row append, JSON-safe records."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd


class ToolError(ValueError):
    """A tool rejected its input; ``call_tool`` turns it into a model-visible error text."""


def parse_date(value: str, what: str) -> str:
    """Validate ``YYYY-MM-DD`` and return it unchanged (dates compare as strings)."""
    try:
        datetime.strptime(value, "%Y-%m-%d")
    except ValueError:
        raise ToolError(f"{what} must be a date in YYYY-MM-DD format, got {value!r}") from None
    return value


def parse_datetime(value: str, what: str) -> datetime:
    try:
        return datetime.strptime(value, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise ToolError(
            f"{what} must be a date and time in YYYY-MM-DD HH:MM:SS format, got {value!r}"
        ) from None


def choice_error(value: str, choices: tuple[str, ...], what: str) -> str | None:
    """The model-visible text for a value outside an enum, or None when it is allowed."""
    if value in choices:
        return None
    options = ", ".join(f"'{c}'" for c in choices)
    return f"{what} not valid. Please choose from: {options}."


def py_value(value: Any) -> Any:
    """A cell as a JSON-safe Python value: NaN becomes None, numpy scalars become Python ones."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, np.generic):
        return py_value(value.item())
    return value


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts in column order, JSON-safe (NaN and None both become null)."""
    columns = [str(c) for c in df.columns]
    return [
        {col: py_value(v) for col, v in zip(columns, row, strict=True)}
        for row in df.itertuples(index=False, name=None)
    ]


def paginate(
    rows: list[dict[str, Any]], page: int, page_size: int, noun: str
) -> dict[str, Any]:
    """One page of results plus a ``pagination`` block (``total_<noun>``, page, size, pages)."""
    if page < 1 or page_size < 1:
        raise ToolError("page and page_size must be positive integers")
    total = len(rows)
    start = (page - 1) * page_size
    return {
        noun: rows[start : start + page_size],
        "pagination": {
            f"total_{noun}": total,
            "page": page,
            "page_size": page_size,
            "total_pages": (total + page_size - 1) // page_size,
        },
    }


def contains_ci(series: pd.Series, needle: str) -> np.ndarray:
    """Case-insensitive literal substring match; non-string cells never match."""
    needle = needle.lower()
    return np.fromiter(
        (isinstance(v, str) and needle in v.lower() for v in series.to_numpy()),
        dtype=bool,
        count=len(series),
    )


def next_id(df: pd.DataFrame, column: str) -> str:
    """Next 8-digit ID: one more than the largest numeric ID in the table (from contents only)."""
    numeric = [int(v) for v in df[column].to_numpy() if isinstance(v, str) and v.isdigit()]
    return str(max(numeric) + 1 if numeric else 0).zfill(8)


def next_label(df: pd.DataFrame) -> int:
    """Index label for an appended row: one past the largest integer label (0 if empty)."""
    if len(df.index) == 0:
        return 0
    return int(df.index.max()) + 1


def append_row(df: pd.DataFrame, label: Any, row: dict[str, Any]) -> pd.DataFrame:
    """A new frame with ``row`` appended under ``label``, keeping every column's dtype.

    ``df.loc[label] = ...`` would infer the ``str`` dtype for an empty object column in pandas 3,
    which would silently turn later ``None`` values into NaN.
    """
    if set(row) != {str(c) for c in df.columns}:
        raise ValueError(f"row keys {sorted(row)} do not match columns {list(df.columns)}")
    new = pd.DataFrame(
        {
            col: pd.Series([row[str(col)]], index=[label], dtype=df[col].dtype)
            for col in df.columns
        }
    )
    new.columns = df.columns
    return pd.concat([df, new])


def match_mask(df: pd.DataFrame, column: str, value: str) -> np.ndarray:
    """Rows whose ``column`` equals ``value`` exactly."""
    return np.asarray(df[column].to_numpy() == value, dtype=bool)


def delete_by_id(env: Any, table: str, id_column: str, record_id: str | None, noun: str) -> str:
    """Drop the rows whose ``id_column`` matches: the ``*_delete_*`` tools and their model-visible texts."""
    if not record_id:
        return f"{noun} ID not provided."
    df = env.get(table)
    hit = match_mask(df, id_column, record_id)
    if not hit.any():
        return f"{noun} not found."
    env.put(table, df[~hit])
    return f"{noun} deleted successfully."


def field_by_id(
    df: pd.DataFrame, id_column: str, record_id: str | None, field: str | None, fields: Any, noun: str
) -> object:
    """One field of the row whose ``id_column`` matches: the ``*_get_*_information_by_id`` tools.

    Misses come back as the model-visible texts those tools use ("Email ID not provided.", ...).
    """
    if not record_id:
        return f"{noun} ID not provided."
    if not field:
        return "Field not provided."
    rows = df[match_mask(df, id_column, record_id)]
    if rows.empty:
        return f"{noun} not found."
    if field not in fields:
        return "Field not found."
    return {field: py_value(rows[field].to_numpy()[0])}
