"""Reward for a Workplace Assistant episode, as NeMo Gym 0.7.0's verifier defines it.

Predicted and ground-truth actions are replayed on two fresh environments: each action is
``{"name": ..., "arguments": <JSON text>}``, its arguments passed as given (``null`` ones too, unlike
the tool route), and an action that fails in any way is skipped. Then the compared tables are
lowercased column by column, except ``status``, ``list_name`` and ``board``, and must be equal
(values, index labels, dtypes). A ground truth given as text holds no actions (its characters are
not actions). The session's live tables are not used: the reward depends only on the response and
the ground truth.

Lowercasing uses the ``.str`` accessor on every column, so a compared column that holds no strings
fails the whole check (the route then answers 500, like NeMo Gym's server).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from .environment import CALENDAR, CRM, EMAILS, PLOTS, TASKS, PristineTables, TableKey, WorkplaceEnvironment
from .tools import run_action

#: Tables compared by verify, in the verifier's order (analytics compares the plots, not the visits).
COMPARED_TABLES: tuple[TableKey, ...] = (CALENDAR, EMAILS, PLOTS, TASKS, CRM)
#: Columns where case matters (enum values); every other column is compared lowercased.
CASE_SENSITIVE_COLUMNS = ("status", "list_name", "board")


def extract_function_calls(output: Iterable[Any]) -> list[Any]:
    """The ``function_call`` items of a Responses API ``response.output`` list (dicts or objects
    with attributes, e.g. pydantic models, which become dicts)."""
    calls: list[Any] = []
    for item in output:
        if isinstance(item, Mapping):
            if item.get("type") == "function_call":
                calls.append(dict(item))
        elif getattr(item, "type", None) == "function_call":
            dump = getattr(item, "model_dump", None)
            calls.append(dump() if callable(dump) else {"name": item.name, "arguments": item.arguments})
    return calls


def replay(actions: Any, base: PristineTables | None = None) -> WorkplaceEnvironment:
    """A fresh environment after running ``actions`` in order; failing actions are skipped."""
    env = WorkplaceEnvironment.fresh(base)
    for action in actions or ():
        try:
            run_action(env, action["name"], json.loads(action["arguments"]))
        except Exception:
            continue
    return env


def _lowercase(df: pd.DataFrame) -> pd.DataFrame:
    for column in df.columns:
        if column not in CASE_SENSITIVE_COLUMNS:
            df[column] = df[column].str.lower()
    return df


def tables_match(left: WorkplaceEnvironment, right: WorkplaceEnvironment) -> bool:
    """Whether the compared tables are equal after lowercasing (changes both environments' tables)."""
    lowered = [[_lowercase(env.get(key)) for key in COMPARED_TABLES] for env in (left, right)]
    return all(a.equals(b) for a, b in zip(*lowered, strict=True))


def is_correct(predicted_actions: Any, ground_truth_actions: Any, base: PristineTables | None = None) -> bool:
    predicted = replay(predicted_actions, base)
    expected = replay(ground_truth_actions, base)
    return tables_match(predicted, expected)


def verify_reward(response_output: Iterable[Any], ground_truth: Any) -> float:
    """1.0 when the response's function calls leave the same tables as the ground truth."""
    return 1.0 if is_correct(extract_function_calls(response_output), ground_truth) else 0.0
