"""Glue for workplace_assistant: NeMo Gym's own server app, tools and verifier, unmodified.

Runs INSIDE the oracle environment (the dependency versions of NeMo Gym's lock file, see
``reference.py``). ``resources_servers/workplace_assistant/app.py`` is imported as released, over the
framework stand-ins of ``glue_indirect_prompt_injection`` (a FastAPI app with Starlette's signed
session cookie, the ``/seed_session`` and ``/verify`` routes and the framework's exception
middleware; NeMo Gym's framework itself needs Ray, MLflow and more). Requests go through that FastAPI
app with its test client, so status codes, body bytes, FastAPI's 422 answers and the verifier's
reward are the reference's own.

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
        "rows": [list(row) for row in zip(*columns)] if columns else [[] for _ in range(len(index))],
    }


def table_digest(description: dict) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- the reference app


_STATE: dict[str, Any] = {}


def _app_module() -> Any:
    """NeMo Gym's ``workplace_assistant/app.py``, imported unmodified over the framework stand-ins
    of ``glue_indirect_prompt_injection`` (FastAPI, Starlette's session middleware, the
    framework's exception middleware and request models)."""
    if "module" not in _STATE:
        import importlib
        import sys

        if "nemo_gym.base_resources_server" not in sys.modules:
            import glue_indirect_prompt_injection as framework

            framework._stub_server_utils()
            framework._stub_base_resources_server()
        _STATE["module"] = importlib.import_module("resources_servers.workplace_assistant.app")
    return _STATE["module"]


def _test_client(app: Any) -> Any:
    import warnings

    with warnings.catch_warnings():  # Starlette suggests httpx2 for its test client; httpx is what is pinned
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    return TestClient(app, raise_server_exceptions=False)


def _tool_env():
    from resources_servers.workplace_assistant.utils import get_tools

    return get_tools(TOOLKITS)


class _Server:
    """One reference server and test client; each sequence is a new session (a fresh cookie jar)."""

    def __init__(self) -> None:
        module = _app_module()
        self.server = module.WorkbenchResourcesServer(
            config=module.WorkbenchResourcesServerConfig(name="workplace_assistant")
        )
        self.client = _test_client(self.server.setup_webserver())

    def close(self) -> None:
        self.client.close()

    def run(self, steps: list[dict], full: bool) -> dict:
        client, sessions = self.client, self.server.session_id_to_tool_env
        client.cookies.clear()
        answers = []
        envs: list[dict] = []
        for step in steps:
            op = step["op"]
            if op == "seed":
                resp = client.post("/seed_session", content=b"{}", headers={"content-type": "application/json"})
                envs.extend(sessions.values())  # only this client's session exists (see below)
            elif op == "tool":
                ctype = step.get("content_type", "application/json")
                body = step.get("body")
                resp = client.post(f"/{step['name']}", content=None if body is None else body.encode(),
                                   headers={"content-type": ctype} if ctype else {})
            elif op == "verify":
                resp = client.post("/verify", content=json.dumps(step["body"]).encode(),
                                   headers={"content-type": "application/json"})
            else:
                raise ValueError(f"unknown op {op!r}")
            answers.append([resp.status_code, resp.content.decode("utf-8", errors="replace")])
        tables = None
        if envs:
            last = envs[-1]
            tables = {f"{c}.{a}": describe_table(getattr(last["containers"][c], a)) for c, a in TABLES}
            if not full:
                tables = {key: table_digest(d) for key, d in tables.items()}
        sessions.clear()  # the session ends with the sequence: the server holds none between them
        return {"answers": answers, "tables": tables}


def run_sequence(steps: list[dict], full: bool = True) -> dict:
    """Run steps through a fresh reference server (its real FastAPI app) as one client (one session).

    A step is ``{"op": "seed"}``, ``{"op": "tool", "name": N, "body": TEXT_OR_NONE, "content_type": CT}``
    (``content_type`` defaults to JSON; None sends none) or ``{"op": "verify", "body": {...}}``.
    Answers are ``[status, body text]``; ``tables`` are the session's tables after the last step
    (kept even when verify dropped the session), as digests unless ``full``.
    """
    server = _Server()
    try:
        return server.run(steps, full)
    finally:
        server.close()


def rewards(bodies: list[dict]) -> list:
    """``POST /verify`` for each full verify request body: [status, reward or body]. No seed first:
    the reward does not depend on the session (the verifier replays on fresh environments)."""
    server = _Server()
    out = []
    try:
        for body in bodies:
            status, text = server.run([{"op": "verify", "body": body}], False)["answers"][0]
            out.append([status, json.loads(text)["reward"] if status == 200 else text])
    finally:
        server.close()
    return out


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
    """:func:`run_sequence` for many sessions (one server, a session each) in one round trip; tables
    as digests unless ``full``."""
    server = _Server()
    try:
        return [server.run(steps, full) for steps in sequences]
    finally:
        server.close()
