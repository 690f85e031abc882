"""Strict table comparison for restore checks: stricter than ``assert_frame_equal``, which treats
NaN and ``None`` in object columns as equal and does not compare cell types."""

from __future__ import annotations

import math

import pandas as pd

from .environment import WorkplaceEnvironment


def _cell_kind(v: object) -> object:
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if v is None:
        return "None"
    return type(v)


def _range(frame: pd.DataFrame) -> tuple[int, int, int]:
    """start, stop and step of a frame's ``RangeIndex``."""
    return frame.index.start, frame.index.stop, frame.index.step


def table_differences(left: pd.DataFrame, right: pd.DataFrame) -> list[str]:
    """Human-readable differences between two tables; empty when they are identical."""
    try:
        pd.testing.assert_frame_equal(
            left,
            right,
            check_exact=True,
            check_dtype=True,
            check_index_type=True,
            check_column_type=True,
            check_names=True,
            check_flags=True,
            check_freq=True,
        )
    except AssertionError as exc:
        return [str(exc).splitlines()[0] if str(exc) else "frames differ"]
    problems: list[str] = []
    if type(left.index) is not type(right.index):
        problems.append(f"index type {type(left.index).__name__} != {type(right.index).__name__}")
    elif (
        isinstance(left.index, pd.RangeIndex)
        and isinstance(right.index, pd.RangeIndex)
        and _range(left) != _range(right)
    ):
        problems.append(f"range index {left.index!r} != {right.index!r}")
    for i, col in enumerate(left.columns):
        a = left.iloc[:, i].to_numpy()
        b = right.iloc[:, i].to_numpy()
        if a.dtype != object:
            continue
        for row, (x, y) in enumerate(zip(a, b, strict=True)):
            if _cell_kind(x) != _cell_kind(y):
                problems.append(f"column {col!r} row {row}: {_cell_kind(x)} != {_cell_kind(y)} ({x!r} vs {y!r})")
                break
    return problems


def environment_differences(left: WorkplaceEnvironment, right: WorkplaceEnvironment) -> list[str]:
    """Differences over all seven tables, prefixed by table."""
    right_tables = dict(right.items())
    out: list[str] = []
    for key, df in left.items():
        out += [f"{key[0]}.{key[1]}: {p}" for p in table_differences(df, right_tables[key])]
    return out
