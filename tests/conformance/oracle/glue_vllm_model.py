"""Glue: NeMo Gym's own ``responses_api_models/vllm_model`` app, asked for token information, in front of an upstream.

The reference model server is built from the wheel as ``run_webserver`` builds it (``framework.build_app``)
with ``return_token_id_information: true`` and the upstream given by the test (our built-in inference
worker, a real process on 127.0.0.1); each request is sent to its ``POST /v1/responses`` and the answer
returned as ``{status, body}``.
"""

from __future__ import annotations

from typing import Any

from framework import Session, build_app, install_import_shims, server_config


def responses(base_url: str, model: str, requests: list[dict[str, Any]], request_ids: bool = False) -> list[dict[str, Any]]:
    install_import_shims()
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
    _, app = build_app(VLLMModel, config)
    session = Session(app)
    return [session.request({"method": "POST", "path": "/v1/responses", "json": body}) for body in requests]
