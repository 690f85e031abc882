"""Glue: NeMo Gym's own ``responses_api_models/vllm_model`` app, asked for token information, in front of an upstream.

The reference model server is built from the wheel as ``run_webserver`` builds it (``framework.assemble``)
with ``return_token_id_information: true`` and the upstream given by the test (our built-in inference
worker, a real process on 127.0.0.1), reached through NeMo Gym's own aiohttp client; each request is sent
to its ``POST /v1/responses`` and the answer returned as ``{status, body}``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from framework import assemble, install_import_shims, server_config


def responses(
    base_url: str, model: str, requests: list[dict[str, Any]], request_ids: bool = False
) -> list[dict[str, Any]]:
    install_import_shims()
    from unittest.mock import MagicMock

    from nemo_gym.server_utils import ServerClient
    from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

    config = VLLMModelConfig(
        **server_config(
            "policy_model",
            base_url=base_url,
            api_key="unused",
            model=model,
            return_token_id_information=True,
            request_prompt_and_generation_token_ids=request_ids,
            uses_reasoning_parser=False,
        )
    )
    # a server client that is never called, with an empty global config (no token capture, no model-call capture)
    client = MagicMock(spec=ServerClient)
    client.global_config_dict = {}
    app = assemble(VLLMModel(config=config, server_client=client))
    return asyncio.run(_post_all(app, requests))


async def _post_all(app: Any, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import httpx
    from nemo_gym import server_utils

    session = server_utils.set_global_aiohttp_client(server_utils.GlobalAIOHTTPAsyncClientConfig())
    answers = []
    try:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://oracle", timeout=120) as http:
            for body in requests:
                reply = await http.post("/v1/responses", json=body)
                try:
                    answers.append({"status": reply.status_code, "body": reply.json()})
                except ValueError:
                    answers.append({"status": reply.status_code, "body": reply.text})
    finally:
        await session.close()
        server_utils._GLOBAL_AIOHTTP_CLIENT = None
    return answers
