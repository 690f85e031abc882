"""Glue for workplace_assistant: NeMo Gym's unmodified tool and verifier modules behind HTTP-like steps.

Runs INSIDE the oracle environment (pandas/numpy of NeMo Gym's lock file). Our own stand-in for the
reference's FastAPI app (``resources_servers/workplace_assistant/app.py``), which cannot be imported
without NeMo Gym's server stack. It reproduces what that app does around the modules:

* ``POST /seed_session`` with a JSON object body: a fresh ``get_tools(<all five toolkits>)`` for the
  session, answer ``{}``.
* ``POST /<tool>``: the body must be a JSON object (else FastAPI's 422); unseeded -> 400 with the
  app's ``detail``; keys with ``null`` values are dropped; the function is looked up and called with the
  rest as keyword arguments; any exception (unknown tool included) becomes the output text
  ``Error executing tool '<tool>': <str(exc)>``; the answer is ``{"output": ...}`` as FastAPI writes
  it (pydantic's JSON mode, so NaN -> null, then compact ``json.dumps`` with ``ensure_ascii=False``).
* ``POST /verify``: ``is_correct(<the response's function_call items>, ground_truth, None)``; the
  session is dropped afterwards, raise or not. Only the reward is compared (the echo of the request is
  NeMo Gym's own pydantic models; see the README's conformance section).

The module's top level imports nothing of the reference, so the test side may import
:func:`describe_table` and :func:`fastapi_json` to treat our tables and bodies the same way.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

TOOLKITS = ["email", "calendar", "analytics", "project_management", "customer_relationship_manager"]

#: (container, attribute) of every table the tools hold, in a fixed order; the verifier compares five.
TABLES = [
    ("company_directory", "_emails"),
    ("email", "_emails"),
    ("calendar", "_calendar_events"),
    ("analytics", "_analytics_data"),
    ("analytics", "_plots_data"),
    ("project_management", "_project_tasks"),
    ("customer_relationship_manager", "_crm_data"),
]

NOT_SEEDED = "Session not initialized. Please call seed_session first."


class Unserialisable(Exception):
    """The tool output holds a value pydantic's JSON mode cannot write (the app would answer 500)."""


def _jsonable(value: Any) -> Any:
    """pydantic's JSON mode for an ``Any`` field, for the types the tools return."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return None if (math.isnan(value) or math.isinf(value)) else value
    if isinstance(value, dict):
        return {_key(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    raise Unserialisable(f"Unable to serialize unknown type: {type(value)!r}")


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, (bool, int, float)) or key is None:
        return json.dumps(key)
    raise Unserialisable(f"Unable to serialize unknown type: {type(key)!r}")


def fastapi_json(content: Any) -> str:
    """The body text FastAPI's ``JSONResponse`` writes: compact, UTF-8, no NaN."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))


def body_error(raw: str | None, content_type: str | None = "application/json") -> tuple[int, str] | None:
    """FastAPI's 422 for a body that is not a JSON object (``raw`` None = no body at all).

    As FastAPI 0.165.0 with pydantic 2.14 answers (checked against a real FastAPI app with the
    reference route's signature): only a JSON content type is parsed, ``null`` is not "missing".
    """
    if raw is None or raw == "":
        detail = [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]
        return 422, fastapi_json({"detail": detail})
    main = (content_type or "").split(";", 1)[0].strip().lower()
    if main == "application/json" or (main.startswith("application/") and main.endswith("+json")):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as exc:
            detail = [{"type": "json_invalid", "loc": ["body", exc.pos], "msg": "JSON decode error",
                       "input": {}, "ctx": {"error": exc.msg}}]
            return 422, fastapi_json({"detail": detail})
    else:
        parsed = raw
    if not isinstance(parsed, dict):
        detail = [{"type": "model_attributes_type", "loc": ["body"],
                   "msg": "Input should be a valid dictionary or object to extract fields from",
                   "input": parsed}]
        return 422, fastapi_json({"detail": detail})
    return None


# ----------------------------------------------------------------------------- tables


def _cell(value: Any) -> Any:
    """A cell exactly: a plain ``str`` as itself, anything else as ``[type name, value]`` (so NaN,
    None, numpy scalars and Python numbers stay apart)."""
    if type(value) is str:
        return value
    if value is None:
        return ["None"]
    if isinstance(value, float) and math.isnan(value):
        return ["nan", type(value).__name__]
    if type(value) in (bool, int, float):
        return [type(value).__name__, value]
    return [type(value).__module__ + "." + type(value).__name__, repr(value)]


def describe_table(df: Any) -> dict:
    """Everything ``DataFrame.equals`` and a later tool call can see: columns, dtypes, index, cells."""
    index = df.index
    columns = [[_cell(v) for v in df.iloc[:, i].tolist()] for i in range(df.shape[1])]
    return {
        "columns": [str(c) for c in df.columns],
        "dtypes": [str(t) for t in df.dtypes],
        "index_type": type(index).__name__,
        "index_dtype": str(index.dtype),
        "index": [_cell(v) for v in index.tolist()],
        "rows": [list(row) for row in zip(*columns)] if columns else [[] for _ in range(len(index))],
    }


def table_digest(description: dict) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- the app's steps


def _tool_env():
    from resources_servers.workplace_assistant.utils import get_tools

    return get_tools(TOOLKITS)


def _tool_step(env: dict | None, name: str, raw: str | None, content_type: str | None) -> tuple[int, str]:
    bad = body_error(raw, content_type)
    if bad is not None:
        return bad
    if env is None:
        return 400, fastapi_json({"detail": NOT_SEEDED})
    args = {k: v for k, v in json.loads(raw).items() if v is not None}
    try:
        result = env["functions"][name](**args)
    except Exception as exc:  # noqa: BLE001 - the app returns every failure to the model
        result = f"Error executing tool '{name}': {exc}"
    try:
        return 200, fastapi_json({"output": _jsonable(result)})
    except Unserialisable as exc:
        # the exception middleware answers the repr of pydantic's serialization error
        return 500, fastapi_json(f"PydanticSerializationError({exc})")


def _reward(env_unused: Any, output: list, ground_truth: Any) -> tuple[int, Any]:
    from resources_servers.workplace_assistant.utils import is_correct

    predicted = [item for item in output if isinstance(item, dict) and item.get("type") == "function_call"]
    try:
        return 200, float(is_correct(predicted, ground_truth, None) * 1.0)
    except Exception as exc:  # noqa: BLE001 - the app's exception middleware answers 500
        return 500, repr(exc)


def run_sequence(steps: list[dict], full: bool = True) -> dict:
    """Run steps in one session; returns every answer and the final tables.

    A step is ``{"op": "seed"}``, ``{"op": "tool", "name": N, "body": RAW_TEXT_OR_NONE}`` or
    ``{"op": "verify", "output": [...], "ground_truth": ...}`` (the verify request is assumed valid).
    """
    env = None
    last_env = None
    answers = []
    for step in steps:
        op = step["op"]
        if op == "seed":
            env = _tool_env()
            last_env = env
            answers.append([200, "{}"])
        elif op == "tool":
            answers.append(list(_tool_step(env, step["name"], step.get("body"),
                                            step.get("content_type", "application/json"))))
        elif op == "verify":
            if env is None:
                answers.append([400, fastapi_json({"detail": NOT_SEEDED})])
                continue
            answers.append(list(_reward(env, step["output"], step["ground_truth"])))
            env = None
        else:
            raise ValueError(f"unknown op {op!r}")
    tables = None
    if last_env is not None:
        tables = {f"{c}.{a}": describe_table(getattr(last_env["containers"][c], a)) for c, a in TABLES}
        if not full:
            tables = {key: table_digest(d) for key, d in tables.items()}
    return {"answers": answers, "tables": tables}


def rewards(cases: list[dict]) -> list:
    """``is_correct`` for many (output, ground_truth) pairs: [status, reward-or-error] each."""
    return [list(_reward(None, case["output"], case["ground_truth"])) for case in cases]


def table_ids() -> dict:
    """Real IDs and values from the pristine tables, for building random calls."""
    env = _tool_env()
    c = env["containers"]
    return {
        "email_id": c["email"]._emails["email_id"].tolist(),
        "event_id": c["calendar"]._calendar_events["event_id"].tolist(),
        "task_id": c["project_management"]._project_tasks["task_id"].tolist(),
        "customer_id": c["customer_relationship_manager"]._crm_data["customer_id"].tolist(),
        "visitor_id": c["analytics"]._analytics_data["visitor_id"].tolist(),
        "address": c["company_directory"]._emails["email_address"].tolist(),
    }


def run_sequences(sequences: list[list[dict]], full: bool = False) -> list[dict]:
    """:func:`run_sequence` for many sessions in one round trip (tables as digests unless ``full``)."""
    return [run_sequence(steps, full) for steps in sequences]
