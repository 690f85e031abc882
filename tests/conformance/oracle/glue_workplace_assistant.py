"""Glue for workplace_assistant: NeMo Gym's own server, tools and verifier, unmodified, on its real framework.

Runs INSIDE the oracle environment (the dependency versions of NeMo Gym's lock file, see
``reference.py``). ``resources_servers/workplace_assistant/app.py`` is imported as released and its
app assembled by ``framework.py`` as NeMo Gym's ``run_webserver`` assembles it (session middleware,
the framework's routes, exception middleware, validation handler). Requests go through that FastAPI
app over httpx, so status codes, body bytes, FastAPI's 422 answers, the verify echo and the
verifier's reward are the reference's own.

The module's top level imports nothing of the reference, so the test side imports
:func:`describe_table` and :func:`table_digest` to describe our tables the same way.
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
    columns = [[v if type(v) is str else _cell(v) for v in df.iloc[:, i].tolist()] for i in range(df.shape[1])]
    return {
        "columns": [str(c) for c in df.columns],
        "dtypes": [str(t) for t in df.dtypes],
        "index_type": type(index).__name__,
        "index_dtype": str(index.dtype),
        "index": [_cell(v) for v in index.tolist()],
        "rows": [list(row) for row in zip(*columns, strict=True)] if columns else [[] for _ in range(len(index))],
    }


def table_digest(description: dict) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- the reference app


_STATE: dict[str, Any] = {}


def _server_and_app() -> tuple[Any, Any]:
    """One reference server and its app for every run (each run is a new client, so a new session)."""
    if "app" not in _STATE:
        from framework import build_app, install_import_shims, server_config

        install_import_shims()
        import resources_servers.workplace_assistant.app as module

        config = module.WorkbenchResourcesServerConfig(**server_config("workplace_assistant"))
        _STATE["server"], _STATE["app"] = build_app(module.WorkbenchResourcesServer, config)
    return _STATE["server"], _STATE["app"]


def _tool_env():
    from resources_servers.workplace_assistant.utils import get_tools

    return get_tools(TOOLKITS)


def _call(step: dict) -> dict:
    """A step as a ``framework.Session`` call."""
    op = step["op"]
    if op == "seed":
        return {"path": "/seed_session", "raw": "{}", "content_type": "application/json"}
    if op == "tool":
        return {
            "path": f"/{step['name']}",
            "raw": step.get("body"),
            "content_type": step.get("content_type", "application/json"),
        }
    if op == "verify":
        return {"path": "/verify", "raw": json.dumps(step["body"]), "content_type": "application/json"}
    if op == "http":
        return step["call"]
    raise ValueError(f"unknown op {op!r}")


def _run(steps: list[dict], full: bool) -> dict:
    from framework import Session

    server, app = _server_and_app()
    sessions = server.session_id_to_tool_env
    client = Session(app)
    answers = []
    envs: list[dict] = []
    try:
        for step in steps:
            before = dict(sessions)
            call = _call(step)
            answer = client.request(call)
            if call["path"] == "/seed_session":  # a new session, or a session seeded again
                envs.extend(env for k, env in sessions.items() if before.get(k) is not env)
            answers.append([answer["status"], answer["body"]])
    finally:
        client.close()
    tables = None
    if envs:
        last = envs[-1]
        tables = {f"{c}.{a}": describe_table(getattr(last["containers"][c], a)) for c, a in TABLES}
        if not full:
            tables = {key: table_digest(d) for key, d in tables.items()}
    sessions.clear()  # the session ends with the sequence: the server holds none between them
    return {"answers": answers, "tables": tables}


def run_sequence(steps: list[dict], full: bool = True) -> dict:
    """Run steps through the reference server (its real FastAPI app) as one client (one session).

    A step is ``{"op": "seed"}``, ``{"op": "tool", "name": N, "body": TEXT_OR_NONE, "content_type": CT}``
    (``content_type`` defaults to JSON; None sends none), ``{"op": "verify", "body": {...}}`` or
    ``{"op": "http", "call": CALL}`` (any request, see ``framework.Session``). Answers are ``[status,
    body text]``; ``tables`` are the session's tables after the last step (kept even when verify
    dropped the session), as digests unless ``full``.
    """
    return _run(steps, full)


def verify_answers(bodies: list[dict]) -> list[list]:
    """``POST /verify`` for each verify request body: ``[status, body text]``. No seed first: the
    answer does not depend on the session (the verifier replays on fresh environments)."""
    return [_run([{"op": "verify", "body": body}], False)["answers"][0] for body in bodies]


def rewards(bodies: list[dict]) -> list:
    """:func:`verify_answers` reduced to ``[status, reward or body]``."""
    return [[status, json.loads(text)["reward"] if status == 200 else text] for status, text in verify_answers(bodies)]


def table_ids() -> dict:
    """Real IDs and values from the pristine tables, for building random calls."""
    _server_and_app()
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
    """:func:`run_sequence` for many sessions in one round trip; tables as digests unless ``full``."""
    return [_run(steps, full) for steps in sequences]
