"""Streaming chat completions from an OpenAI-compatible upstream (the built-in worker or vLLM)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from gym_services.base.errors import ApiError


class UpstreamConfig(BaseModel):
    """Where generations come from: the built-in worker locally, vLLM in production."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(default="http://127.0.0.1:8001/v1", description="OpenAI base URL, ending in /v1")
    api_key: SecretStr | None = None
    model: str | None = Field(default=None, description="model name sent upstream; the request's when unset")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=600.0, gt=0, description="longest silence between two chunks")
    max_connections: int = Field(default=512, ge=1)
    continuous_usage: bool = Field(
        default=True, description="ask for usage on every chunk (vLLM stream_options.continuous_usage_stats)"
    )
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every upstream request")


@dataclass
class Delta:
    """One upstream chunk, reduced to what the policy model keeps."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def has_token(self) -> bool:
        return bool(self.text or self.tool_calls)


def _delta(chunk: dict[str, Any]) -> Delta:
    delta = Delta()
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        delta.prompt_tokens = usage.get("prompt_tokens")
        delta.completion_tokens = usage.get("completion_tokens")
    for choice in chunk.get("choices") or []:
        if choice.get("index", 0) != 0:
            continue
        body = choice.get("delta") or {}
        delta.text = body.get("content") or ""
        delta.tool_calls = list(body.get("tool_calls") or [])
        delta.finish_reason = choice.get("finish_reason")
    return delta


class Upstream:
    """One pooled HTTP client for every generation of this model server."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        c = self.config
        headers = {"authorization": f"Bearer {c.api_key.get_secret_value()}"} if c.api_key else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(c.read_timeout_s, connect=c.connect_timeout_s),
            limits=httpx.Limits(max_connections=c.max_connections, max_keepalive_connections=64),
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def stream_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"include_usage": True}
        if self.config.continuous_usage:
            options["continuous_usage_stats"] = True
        return options

    async def deltas(self, body: dict[str, Any]) -> AsyncIterator[Delta]:
        """Stream one chat completion; closing this generator early closes the upstream stream."""
        if self._client is None:
            raise ApiError("not_ready", "the upstream client is not started")
        payload = {**self.config.extra_body, **body, "stream": True, "stream_options": self.stream_options()}
        try:
            async with self._client.stream("POST", self.url, json=payload) as response:
                if response.status_code != 200:
                    raw = (await response.aread()).decode("utf-8", "replace")
                    raise ApiError(
                        "upstream_error",
                        f"upstream {self.url} answered {response.status_code}: {raw[:500]}",
                        details={"upstream_status": response.status_code},
                    )
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        raise ApiError("upstream_error", f"upstream sent a chunk that is not JSON: {data[:200]}") from None
                    if isinstance(chunk, dict) and "error" in chunk:
                        raise ApiError("upstream_error", f"upstream stream failed: {json.dumps(chunk['error'])[:500]}")
                    yield _delta(chunk)
        except httpx.HTTPError as exc:
            raise ApiError("upstream_error", f"upstream {self.url} failed: {type(exc).__name__}: {exc}") from None
