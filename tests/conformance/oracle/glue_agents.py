"""Oracle glue for the agents: NeMo Gym's simple, proof refinement and gymnasium agents, run unmodified.

Runs INSIDE the oracle environment (see ``reference.py``), on NeMo Gym's real framework
(``framework.py``), like every glue.

Each call of :func:`run_episode` starts, on 127.0.0.1 ports of its own:

- a :class:`scripted.ScriptedModel` (the policy model) answering the given responses in order,
- a :class:`scripted.ScriptedServer` (the resources or environment server) answering per path,
- the reference agent itself: its class from ``responses_api_agents/<agent>/app.py`` built with the
  given config, its FastAPI app assembled by ``framework.assemble`` as NeMo Gym's ``run_webserver``
  assembles it, served by uvicorn; its ``ServerClient`` resolves server names to those ports,

then posts the row to the agent's ``/run`` and returns the answer and every request the scripted
servers received. The agent talks to them over real HTTP through NeMo Gym's own aiohttp client.

Import shims (the only parts not taken from the released wheel or its pinned dependencies): those of
``framework.install_import_shims``, none of which plays a part in an agent's requests or answers.
Everything else is the released code running on the versions pinned in ``ORACLE_REQUIREMENTS``.
"""

from __future__ import annotations

import asyncio
import importlib
import socket
import sys
from pathlib import Path
from typing import Any

_SHIMS_READY = False
#: agent kind -> (module, agent class, config class)
AGENTS = {
    "simple_agent": ("responses_api_agents.simple_agent.app", "SimpleAgent", "SimpleAgentConfig"),
    "proof_refinement_agent": (
        "responses_api_agents.proof_refinement_agent.app",
        "ProofRefinementAgent",
        "ProofRefinementAgentConfig",
    ),
    "gymnasium_agent": ("responses_api_agents.gymnasium_agent.app", "GymnasiumAgent", "GymnasiumAgentConfig"),
}
MODEL_SERVER = "policy_model"
RESOURCES_SERVER = "scripted_resources"


def _install_shims() -> None:
    global _SHIMS_READY
    if _SHIMS_READY:
        return
    from framework import install_import_shims

    install_import_shims()
    # scripted.py lives one folder up (tests/conformance), shared with the test side
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    _SHIMS_READY = True


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def _port(sock: socket.socket) -> int:
    return sock.getsockname()[1]


def _received(items: list[Any]) -> list[dict[str, Any]]:
    return [{"path": r.path, "body": r.body, "cookies": r.cookies, "status": r.status} for r in items]


async def _serve(app: Any, sock: socket.socket) -> tuple[Any, asyncio.Task]:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            break
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError("a scripted server did not start within 5 s")
    return server, task


async def _run(
    kind: str,
    config: dict[str, Any],
    row: Any,
    model_script: list[dict[str, Any]],
    env_answers: dict[str, list[dict[str, Any]]],
    model_cookies: dict[str, str],
) -> dict[str, Any]:
    import aiohttp
    import scripted
    from framework import assemble
    from nemo_gym import server_utils
    from nemo_gym.config_types import BaseServerConfig
    from omegaconf import OmegaConf

    module_name, agent_cls_name, config_cls_name = AGENTS[kind]
    module = importlib.import_module(module_name)
    agent_cls = getattr(module, agent_cls_name)
    config_cls = getattr(module, config_cls_name)

    model = scripted.ScriptedModel({scripted.DEFAULT: model_script}, set_cookies=model_cookies)
    env = scripted.ScriptedServer(env_answers)
    socks = {"model": _listening_socket(), "env": _listening_socket(), "agent": _listening_socket()}
    agent_name = f"{kind}_under_test"
    global_config = OmegaConf.create(
        {
            MODEL_SERVER: {"responses_api_models": {"scripted": {"host": "127.0.0.1", "port": _port(socks["model"])}}},
            RESOURCES_SERVER: {"resources_servers": {"scripted": {"host": "127.0.0.1", "port": _port(socks["env"])}}},
            agent_name: {"responses_api_agents": {kind: {"host": "127.0.0.1", "port": _port(socks["agent"])}}},
        }
    )
    agent_config = config_cls.model_validate(
        {
            "host": "127.0.0.1",
            "port": _port(socks["agent"]),
            "entrypoint": "app.py",
            "name": agent_name,
            "model_server": {"type": "responses_api_models", "name": MODEL_SERVER},
            "resources_server": {"type": "resources_servers", "name": RESOURCES_SERVER},
            **config,
        }
    )
    client = server_utils.ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=global_config
    )
    agent = agent_cls(config=agent_config, server_client=client)
    session = server_utils.set_global_aiohttp_client(server_utils.GlobalAIOHTTPAsyncClientConfig())
    servers = []
    try:
        servers.append(await _serve(model.app, socks["model"]))
        servers.append(await _serve(env.app, socks["env"]))
        servers.append(await _serve(assemble(agent), socks["agent"]))
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{_port(socks['agent'])}/run"
            async with http.post(url, json=row, timeout=aiohttp.ClientTimeout(total=60)) as reply:
                status = reply.status
                text = await reply.text()
    finally:
        for server, _ in servers:
            server.should_exit = True
        for _, task in servers:
            await asyncio.wait_for(task, 10)
        await session.close()
        server_utils._GLOBAL_AIOHTTP_CLIENT = None
        for sock in socks.values():
            sock.close()
    return {
        "status": status,
        "text": text,
        "model_requests": _received(model.received.get(scripted.DEFAULT, [])),
        "env_requests": _received(env.received),
    }


def run_episode(
    kind: str,
    config: dict[str, Any],
    row: Any,
    model_script: list[dict[str, Any]],
    env_answers: dict[str, list[dict[str, Any]]],
    model_cookies: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One ``/run`` of the reference agent ``kind`` against scripted servers; what each side saw."""
    _install_shims()
    return asyncio.run(_run(kind, config, row, model_script, env_answers, dict(model_cookies or {})))


def versions() -> dict[str, str]:
    _install_shims()
    import aiohttp
    import fastapi
    import openai
    import pydantic

    return {
        "openai": openai.__version__,
        "pydantic": pydantic.VERSION,
        "fastapi": fastapi.__version__,
        "aiohttp": aiohttp.__version__,
    }
