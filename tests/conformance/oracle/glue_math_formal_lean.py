"""Runs INSIDE the oracle environment: NeMo Gym's math_formal_lean server, its own app, driven over HTTP.

The reference compiles proofs by posting to a Lean sandbox (``Lean4SandboxClient.execute_lean4``).
No Lean toolchain exists here, so the glue gives that client an httpx transport that answers from a
script the caller supplies (one answer per sandbox request: a JSON reply with its status, a
non-JSON body, a timeout or a connection failure) and records every request it receives (method,
URL, content type, timeout, body text). Everything else (routes, request validation, proof
extraction, the client's handling of each answer, feedback, the correction prompt, the reward and
the response body) is the reference's own code.
"""

from __future__ import annotations

import json
from typing import Any

from framework import Session, build_app, install_import_shims, server_config
from sandbox_script import ScriptedSandbox

_apps: dict[str, Any] = {}
_sandbox = ScriptedSandbox()


def _app(config: dict[str, Any]) -> Any:
    key = json.dumps(config, sort_keys=True)
    if key not in _apps:
        install_import_shims()
        import httpx
        import resources_servers.math_formal_lean.app as lean

        settings = server_config("math_formal_lean", **config)
        server, app = build_app(
            lean.MathFormalLeanResourcesServer, lean.MathFormalLeanResourcesServerConfig(**settings)
        )
        # the client's own _get_client() returns this one: same requests, answered from the script
        server._sandbox_client._client = httpx.AsyncClient(transport=_sandbox.transport)
        _apps[key] = app
    return _apps[key]


def run_sequences(sequences: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each sequence ``{config?, sandbox: [answers], calls}``: a fresh client session against the app of
    ``config`` (server config overrides). Returns per sequence ``{answers: [{status, body, sandbox}],
    unused_answers, overdrawn}``; ``sandbox`` lists the requests the sandbox received during that call."""
    results = []
    for sequence in sequences:
        app = _app(sequence.get("config") or {})
        _sandbox.load(sequence.get("sandbox", []))
        session = Session(app)
        answers = []
        try:
            for call in sequence["calls"]:
                answer = session.request(call)
                answers.append({**answer, "sandbox": _sandbox.take_received()})
        finally:
            session.close()
        results.append({"answers": answers, "unused_answers": len(_sandbox.script), "overdrawn": _sandbox.overdrawn})
    return results
