"""Building policy model apps, requests from the shipped tasks, and reading the worker's counts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
from tests.support.asgi import base_config, serve

from gym_services.base.config import load_config
from gym_services.models.inference_worker.policies.base import load_tasks
from gym_services.models.policy_model.app import Config, create_app
from gym_services.models.policy_model.generations import Generation


def model_app(upstream_url: str, **extra: Any):
    upstream = {"base_url": f"{upstream_url}/v1", **extra.pop("upstream", {})}
    overrides = base_config("policy_model", upstream=upstream, **extra)
    return create_app(load_config(Config, overrides=overrides))


def _request(environment: str, index: int, model: str) -> dict[str, Any]:
    params = dict(load_tasks(environment)[index]["responses_create_params"])
    return {**params, "model": model}


def requests_by_policy() -> dict[str, dict[str, Any]]:
    """One Responses request per policy (the first turn of a shipped task)."""
    blackjack = _request("blackjack", 0, "blackjack-basic")
    blackjack["input"] = [
        *blackjack["input"],
        {
            "role": "user",
            "content": "Your hand: [10, 6] = 16\nDealer shows: 9\nRespond with <action>hit</action> or "
            "<action>stand</action>.",
        },
    ]
    return {
        "workplace": _request("workplace_assistant", 3, "workplace-oracle"),
        "lean": _request("math_formal_lean", 0, "lean-refine"),
        "ipi": _request("indirect_prompt_injection", 2, "ipi-follow"),
        "blackjack": blackjack,
    }


REQUESTS = requests_by_policy()


def ident(rollout_id: str, attempt: int = 0) -> dict[str, str]:
    return {"x-ng-rollout-id": rollout_id, "x-ng-attempt": str(attempt)}


async def worker_tokens(worker_url: str) -> int:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{worker_url}/stats")).json()["tokens_generated"]


async def reference(fast_url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The uninterrupted response, from a model in front of the fast worker."""
    async with serve(model_app(fast_url)) as client:
        resp = await client.post("/v1/responses", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


def generations(client: httpx.AsyncClient) -> list[Generation]:
    return list(client._transport.app.state.generations.live.values())  # type: ignore[attr-defined]


def generation_of(client: httpx.AsyncClient, rollout_id: str) -> Generation | None:
    for g in generations(client):
        if g.identity is not None and g.identity.rollout_id == rollout_id:
            return g
    return None


async def tokens_received(client: httpx.AsyncClient, rollout_id: str, at_least: int) -> Generation:
    """Wait until the rollout's generation has received ``at_least`` tokens."""

    def ready() -> bool:
        g = generation_of(client, rollout_id)
        return g is not None and g.completion_tokens >= at_least

    await wait_until(ready, what=f"{at_least} tokens of {rollout_id}")
    found = generation_of(client, rollout_id)
    assert found is not None
    return found
