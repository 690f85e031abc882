"""Oracle glue for indirect_prompt_injection: NeMo Gym's own server, unmodified, on its real framework.

Runs INSIDE the oracle environment (see ``reference.py``). The reference's ``app.py``, its nine
``*_tools.py`` modules, ``common_tools.py`` and ``verifier.py`` are imported unmodified, over the
real ``nemo_gym`` framework, and the app is assembled by ``framework.py`` as NeMo Gym's
``run_webserver`` assembles it (session middleware, the framework's routes, exception middleware,
validation handler).

Randomness: the reference mints IDs with ``uuid.uuid4().hex[:6].upper()``. Each tool module's ``uuid``
name is pointed at a stand-in whose ``uuid4()`` draws from the session's ID stream: the same stream our
server draws from (sha256 of ``"<seed>:<n>"``, the seed being a digest of the environment as seeded),
so minted IDs can be compared byte for byte. The session a request belongs to is the one its client
seeded (learnt from the server's sessions after each seed). Nothing else differs from the released code.

Entry points (called through ``driver.py``): ``run(steps)``, ``run_many(sequences)``,
``tool_names()``, ``verification_types()``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import types
from pathlib import Path
from typing import Any

DOMAINS = [
    "healthcare",
    "hr",
    "ecommerce",
    "education",
    "insurance",
    "it_helpdesk",
    "legal",
    "logistics",
    "real_estate",
]
PACKAGE = "resources_servers.indirect_prompt_injection"
SERVER_NAME = "indirect_prompt_injection"


class _Session:
    """Which session the request being served belongs to (set before each request)."""

    current: str | None = None


# --- the ID stream --------------------------------------------------------------------------


class _IdStreams:
    """Per session: the seed (a digest of the environment as seeded) and how many IDs were drawn."""

    def __init__(self) -> None:
        self.streams: dict[str, list[Any]] = {}

    def reset(self, session_id: str, environment: Any) -> None:
        canonical = json.dumps(environment, sort_keys=True, separators=(",", ":"))
        self.streams[session_id] = [hashlib.sha256(canonical.encode()).hexdigest()[:16], 0]

    def uuid4(self) -> Any:
        stream = self.streams[_Session.current]
        seed, n = stream
        stream[1] += 1
        return types.SimpleNamespace(hex=hashlib.sha256(f"{seed}:{n}".encode()).hexdigest()[:32])


_STREAMS = _IdStreams()
_STATE: dict[str, Any] = {}


def _setup() -> dict[str, Any]:
    if _STATE:
        return _STATE
    from framework import install_import_shims

    install_import_shims()
    from nemo_gym.server_utils import SimpleServer

    # NeMo Gym starts a server as ``python app.py``: its classes live in ``__main__``, which shows in
    # the text of some errors, so the app module is loaded under that name (sys.modules keeps ours).
    # Its last line then calls ``run_webserver()`` (global config, uvicorn): while it loads, that
    # classmethod does nothing; the glue builds and serves the app itself (``framework.build_app``)
    path = Path(importlib.import_module(f"{PACKAGE}.verifier").__file__).with_name("app.py")
    spec = importlib.util.spec_from_file_location("__main__", path)
    app_module = importlib.util.module_from_spec(spec)
    run_webserver = SimpleServer.__dict__["run_webserver"]
    SimpleServer.run_webserver = classmethod(lambda cls: None)
    try:
        spec.loader.exec_module(app_module)
    finally:
        SimpleServer.run_webserver = run_webserver
    logging.getLogger("__main__").disabled = True  # it logs every failing tool's traceback
    stand_in = types.SimpleNamespace(uuid4=_STREAMS.uuid4)
    for name in [*(f"{d}_tools" for d in DOMAINS), "common_tools"]:
        module = importlib.import_module(f"{PACKAGE}.{name}")
        module.uuid = stand_in  # the module's global, not its source
    _STATE["module"] = app_module
    _STATE["verifier"] = importlib.import_module(f"{PACKAGE}.verifier")
    return _STATE


# --- entry points ------------------------------------------------------------------------------


def _server() -> Any:
    """One reference server and its app for every run (each run's clients are new sessions)."""
    if "server" not in _STATE:
        from framework import build_app, server_config

        module = _setup()["module"]
        config = module.IPIResourcesServerConfig(**server_config(SERVER_NAME))
        _STATE["server"], _STATE["app"] = build_app(module.IPIResourcesServer, config)
    return _STATE["server"]


def _call(step: dict[str, Any]) -> dict[str, Any]:
    call: dict[str, Any] = {
        "method": step.get("method", "POST"),
        "path": step["path"],
        "raw": step.get("body"),
        "content_type": step.get("content_type"),
    }
    if step.get("body_hex") is not None:
        call["raw_hex"] = step["body_hex"]
    return call


def _run(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from framework import Session

    server = _server()
    envs = server.session_id_to_env
    clients: dict[str, Any] = {}
    sessions: dict[str, str] = {}
    answers = []
    try:
        for step in steps:
            key = step.get("client", "a")
            if key not in clients:
                clients[key] = Session(_STATE["app"])
            _Session.current = sessions.get(key)
            before = set(envs)
            answer = clients[key].request(_call(step))
            if step["path"] == "/seed_session" and answer["status"] == 200:
                new = set(envs) - before
                if new:  # a client's first seed; a reseed keeps its session
                    sessions[key] = new.pop()
                if sessions.get(key) in envs:
                    _STREAMS.reset(sessions[key], envs[sessions[key]])
            sid = sessions.get(key)
            env = envs.get(sid) if sid is not None else None
            answers.append({**answer, "env": None if env is None else json.dumps(env)})
    finally:
        for client in clients.values():
            client.close()
        for sid in sessions.values():
            envs.pop(sid, None)
    return answers


def run(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run HTTP steps against the reference server; per step: status, body, content type, the session's environment.

    A step is ``{"client": KEY, "path": "/x", "body": TEXT, "content_type": CT or None, "method": "POST"}``
    (or ``"body_hex"`` for bytes that are not text); each client key of a run is its own cookie jar,
    so its own session (sessions of earlier runs are never reached again). ``env`` is the session's
    environment as JSON text after the step (``None`` when the session holds none).
    """
    return _run(steps)


def run_many(sequences: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """``run`` for each sequence, in one round trip."""
    return [_run(steps) for steps in sequences]


def tool_names() -> dict[str, list[str]]:
    """Domain -> the reference's tool names (in its registry order)."""
    _setup()
    return {d: list(importlib.import_module(f"{PACKAGE}.{d}_tools").TOOL_HANDLERS) for d in DOMAINS}


def verification_types() -> dict[str, list[str]]:
    return {k: list(v) for k, v in _setup()["verifier"].STRICT_MATCH_KEYS.items()}
