"""Reward for a Workplace Assistant episode: replay predicted and ground-truth actions on two fresh
environments and compare the resulting tables (REFERENCE B.1).

The session's live tables are ignored on purpose, so the reward depends only on the response and
the ground truth.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from .environment import (
    CALENDAR,
    CRM,
    EMAILS,
    PLOTS,
    TASKS,
    PristineTables,
    TableKey,
    WorkplaceEnvironment,
)
from .tools import call_tool

#: Tables compared by verify (analytics compares the plots, not the visit data).
COMPARED_TABLES: tuple[TableKey, ...] = (CALENDAR, EMAILS, PLOTS, TASKS, CRM)
#: Columns where case matters (enum values); every other string column is compared lowercased.
CASE_SENSITIVE_COLUMNS = frozenset({"status", "list_name", "board"})

Action = Mapping[str, Any]


def extract_function_calls(output: Iterable[Any]) -> list[dict[str, Any]]:
    """The ``function_call`` items of a Responses API ``response.output`` list, as
    ``{"name", "arguments"}`` (arguments stay the JSON string the model produced).

    Items may be plain dicts or objects with attributes (e.g. pydantic models).
    """
    calls: list[dict[str, Any]] = []
    for item in output:
        get = item.get if isinstance(item, Mapping) else lambda k, i=item: getattr(i, k, None)
        if get("type") != "function_call":
            continue
        calls.append({"name": get("name"), "arguments": get("arguments")})
    return calls


def parse_actions(actions: Sequence[Action] | str | None) -> list[Action]:
    """Accept an action list, or a JSON string holding one (the ground truth may be a string)."""
    if actions is None:
        return []
    if isinstance(actions, str):
        parsed = json.loads(actions) if actions.strip() else []
        if not isinstance(parsed, list):
            raise ValueError("ground truth string must hold a JSON list of actions")
        return parsed
    return list(actions)


def replay(actions: Sequence[Action], base: PristineTables | None = None) -> WorkplaceEnvironment:
    """A fresh environment after running ``actions`` in order (tool errors change nothing)."""
    env = WorkplaceEnvironment.fresh(base)
    for action in actions:
        name = action.get("name") if isinstance(action, Mapping) else None
        if not isinstance(name, str):
            continue
        call_tool(env, name, action.get("arguments"))
    return env


def _lowercased(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy(deep=False)
    for i, col in enumerate(df.columns):
        if col in CASE_SENSITIVE_COLUMNS:
            continue
        values = df.iloc[:, i].to_numpy()
        if values.dtype != object:
            continue
        lowered = np.array([v.lower() if isinstance(v, str) else v for v in values], dtype=object)
        out.isetitem(i, pd.Series(lowered, index=df.index, dtype=object))
    return out


def tables_match(left: WorkplaceEnvironment, right: WorkplaceEnvironment) -> bool:
    """Whether the compared tables are equal (values, index, dtypes) after lowercasing."""
    return all(
        _lowercased(left.get(key)).equals(_lowercased(right.get(key))) for key in COMPARED_TABLES
    )


def is_correct(
    predicted_actions: Sequence[Action] | str | None,
    ground_truth_actions: Sequence[Action] | str | None,
    base: PristineTables | None = None,
) -> bool:
    predicted = replay(parse_actions(predicted_actions), base)
    expected = replay(parse_actions(ground_truth_actions), base)
    return tables_match(predicted, expected)


def verify_reward(
    response_output: Iterable[Any], ground_truth: Sequence[Action] | str | None
) -> float:
    """1.0 when the response's function calls leave the same tables as the ground truth."""
    return 1.0 if is_correct(extract_function_calls(response_output), ground_truth) else 0.0
