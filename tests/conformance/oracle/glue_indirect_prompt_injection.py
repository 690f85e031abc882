"""Oracle glue for indirect_prompt_injection: NeMo Gym's own server class behind a FastAPI app of ours.

Runs INSIDE the oracle environment (see ``reference.py``). The reference's ``app.py``, its nine
``*_tools.py`` modules, ``common_tools.py`` and ``verifier.py`` are imported unmodified. What they
import from the NeMo Gym framework is provided here instead, because the framework needs Ray, MLflow
and much more:

- ``nemo_gym.server_utils``: only the names ``openai_utils`` and ``app.py`` import (the session key);
- ``nemo_gym.base_resources_server``: the request/response models the app derives from (verify
  requests carry ``responses_create_params`` and ``response`` validated by NeMo Gym's own
  ``openai_utils`` models, imported unmodified) and a ``SimpleResourcesServer`` whose
  ``setup_webserver`` wires what the framework wires for a resources server: Starlette's signed-cookie
  ``SessionMiddleware`` plus a middleware that puts a session id into every request's session, the
  routes ``/seed_session`` and ``/verify`` (before the app's own ``/{tool_name}``), and the
  framework's exception middleware (an unhandled error is ``500`` with ``repr(error)`` as the JSON body).

Randomness: the reference mints IDs with ``uuid.uuid4().hex[:6].upper()``. Each tool module's ``uuid``
name is pointed at a stand-in whose ``uuid4()`` draws from the session's ID stream: the same stream our
server draws from (sha256 of ``"<seed>:<n>"``, the seed being a digest of the environment as seeded),
so minted IDs can be compared byte for byte. Nothing else differs from the released code.

Entry points (called through ``driver.py``): ``run(steps)``, ``run_many(sequences)``, ``canonical_verify(body)``,
``tool_names()``, ``verification_types()``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path
from typing import Any, ClassVar, Optional

from pydantic import BaseModel, ConfigDict, Field

SESSION_KEY = "session_id"
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


# --- what the framework modules provide ---------------------------------------------------


def _stub_server_utils() -> None:
    mod = types.ModuleType("nemo_gym.server_utils")
    mod.SESSION_ID_KEY = SESSION_KEY
    # names openai_utils imports for its HTTP client helpers, which the server never calls
    mod._GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG = False
    mod.MAX_NUM_TRIES = 1
    mod.ClientResponse = type("ClientResponse", (), {})
    mod.ClientResponseError = type("ClientResponseError", (Exception,), {})

    def _unused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the oracle makes no outgoing HTTP calls")

    mod.get_response_json = mod.raise_for_status = mod.request = _unused
    sys.modules["nemo_gym.server_utils"] = mod


class _Session:
    """Which session the request being served belongs to (the middleware sets it)."""

    current: Optional[str] = None
    counter = 0


def _stub_base_resources_server() -> None:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from starlette.middleware.sessions import SessionMiddleware

    from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming

    mod = types.ModuleType("nemo_gym.base_resources_server")

    class BaseResourcesServerConfig(BaseModel):
        name: str = SERVER_NAME

    class BaseRunRequest(BaseModel):
        model_config = ConfigDict(populate_by_name=True)

        responses_create_params: NeMoGymResponseCreateParamsNonStreaming
        capture_rollout_id: Optional[str] = Field(default=None, alias="_ng_rollout_id", exclude=True)

    class BaseVerifyRequest(BaseRunRequest):
        response: NeMoGymResponse

    class BaseVerifyResponse(BaseVerifyRequest):
        reward: float
        mask_sample: bool = False
        failure_kind: Optional[str] = None
        failure_reason: Optional[str] = None

    class BaseSeedSessionRequest(BaseModel):
        pass

    class BaseSeedSessionResponse(BaseModel):
        pass

    class SimpleResourcesServer(BaseModel):
        config: BaseResourcesServerConfig
        ray_enabled: ClassVar[Optional[bool]] = None

        @classmethod
        def run_webserver(cls) -> None:
            """Runs as the module is loaded under ``__main__``; here the glue serves the app itself."""

        def setup_webserver(self) -> FastAPI:
            app = FastAPI()

            @app.middleware("http")
            async def put_session_id(request: Request, call_next):
                if SESSION_KEY not in request.session:
                    _Session.counter += 1
                    request.session[SESSION_KEY] = f"oracle-session-{_Session.counter}"
                else:  # assigned again, as the framework does, so the cookie is re-sent
                    request.session[SESSION_KEY] = request.session[SESSION_KEY]
                _Session.current = request.session[SESSION_KEY]
                return await call_next(request)

            key = f"{type(self).__name__}___{self.config.name}"
            app.add_middleware(SessionMiddleware, secret_key=key, session_cookie=key)

            @app.middleware("http")
            async def errors_as_repr(request: Request, call_next):
                try:
                    return await call_next(request)
                except Exception as exc:  # noqa: BLE001 - the framework's answer to any unhandled error
                    return JSONResponse(content=repr(exc), status_code=500)

            app.post("/seed_session")(self.seed_session)
            app.post("/verify")(self.verify)
            return app

    for name, value in list(locals().items()):
        if isinstance(value, type) and issubclass(value, BaseModel):
            setattr(mod, name, value)
    sys.modules["nemo_gym.base_resources_server"] = mod


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
    _stub_server_utils()
    _stub_base_resources_server()
    # NeMo Gym starts a server as ``python app.py``: its classes live in ``__main__``, which shows in
    # the text of some errors, so the app module is loaded under that name (sys.modules keeps ours)
    path = Path(importlib.import_module(f"{PACKAGE}.verifier").__file__).with_name("app.py")
    spec = importlib.util.spec_from_file_location("__main__", path)
    app_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app_module)
    logging.getLogger("__main__").disabled = True  # it logs every failing tool's traceback
    stand_in = types.SimpleNamespace(uuid4=_STREAMS.uuid4)
    for name in [*(f"{d}_tools" for d in DOMAINS), "common_tools"]:
        module = importlib.import_module(f"{PACKAGE}.{name}")
        module.uuid = stand_in  # the module's global, not its source
    _STATE["module"] = app_module
    _STATE["verifier"] = importlib.import_module(f"{PACKAGE}.verifier")
    return _STATE


def _new_server() -> Any:
    module = _setup()["module"]
    return module.IPIResourcesServer(config=module.IPIResourcesServerConfig(name=SERVER_NAME))


# --- entry points ------------------------------------------------------------------------------


def _server() -> Any:
    """One reference server and its app for every run (each run's clients are new sessions)."""
    if "server" not in _STATE:
        server = _new_server()
        _STATE["server"], _STATE["app"] = server, server.setup_webserver()
    return _STATE["server"]


async def _run(client: Any, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import httpx

    server = _server()
    jars: dict[str, Any] = {}
    sessions: dict[str, str] = {}
    answers = []
    for step in steps:
        key = step.get("client", "a")
        client.cookies = jars.get(key) or httpx.Cookies()
        headers = {}
        if step.get("content_type") is not None:
            headers["content-type"] = step["content_type"]
        body = step.get("body")
        content = body.encode("utf-8") if isinstance(body, str) else None
        if step.get("body_hex") is not None:
            content = bytes.fromhex(step["body_hex"])
        _Session.current = None
        resp = await client.request(step.get("method", "POST"), step["path"], content=content, headers=headers)
        jars[key] = httpx.Cookies(client.cookies)
        if _Session.current is not None:
            sessions[key] = _Session.current
        sid = sessions.get(key)
        if step["path"] == "/seed_session" and resp.status_code == 200 and sid in server.session_id_to_env:
            _STREAMS.reset(sid, server.session_id_to_env[sid])
        env = server.session_id_to_env.get(sid) if sid is not None else None
        answers.append(
            {
                "status": resp.status_code,
                "body": resp.content.decode("utf-8", errors="replace"),
                "content_type": resp.headers.get("content-type"),
                "env": None if env is None else json.dumps(env),
            }
        )
    return answers


async def _run_all(sequences: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    import httpx

    _server()
    transport = httpx.ASGITransport(app=_STATE["app"], raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return [await _run(client, steps) for steps in sequences]


def run(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run HTTP steps against the reference server; per step: status, body, the session's environment.

    A step is ``{"client": KEY, "path": "/x", "body": TEXT, "content_type": CT or None, "method": "POST"}``
    (or ``"body_hex"`` for bytes that are not text); each client key of a run is its own cookie jar,
    so its own session (sessions of earlier runs are never reached again). ``env`` is the session's
    environment as JSON text after the step (``None`` when the session holds none).
    """
    return run_many([steps])[0]


def run_many(sequences: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """``run`` for each sequence, in one round trip."""
    import asyncio

    return asyncio.run(_run_all(sequences))


def canonical_verify(body: dict[str, Any]) -> dict[str, Any] | None:
    """The verify body as NeMo Gym's agent would post it (its request models' dump), or None if invalid."""
    module = _setup()["module"]
    try:
        return module.IPIVerifyRequest.model_validate(body).model_dump(mode="json")
    except Exception:  # noqa: BLE001 - an invalid body has no canonical form
        return None


def tool_names() -> dict[str, list[str]]:
    """Domain -> the reference's tool names (in its registry order)."""
    _setup()
    return {d: list(importlib.import_module(f"{PACKAGE}.{d}_tools").TOOL_HANDLERS) for d in DOMAINS}


def verification_types() -> dict[str, list[str]]:
    return {k: list(v) for k, v in _setup()["verifier"].STRICT_MATCH_KEYS.items()}
