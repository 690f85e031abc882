"""Configuration every agent shares: where its model is, and how it waits on checkpoints."""

from __future__ import annotations

from pydantic import Field

from gym_services.base.affinity import Endpoints
from gym_services.base.config import ServerConfig


class AgentConfig(ServerConfig):
    """Fields of every agent; each agent adds the URL of its resources or environment server."""

    model_url: Endpoints = Field(
        description="base URL of the policy model serving POST /v1/responses; its replicas' URLs in ordinal order "
        "(a list, or one URL with a {0..N-1} range) when it has several: each rollout's generations go to one of them"
    )
    model: str | None = Field(
        default=None,
        description="model name sent in every generation request in place of the task's own; "
        "unset: the task's create params are sent as they are (as NeMo Gym's agents do)",
    )
    request_timeout_s: float = Field(default=600.0, gt=0, le=86400, description="per downstream call")
    parked_backoff_s: float = Field(
        default=0.1, gt=0, le=10, description="wait after a 409 checkpoint_parked before returning to the boundary"
    )
    parked_retry_limit_s: float = Field(
        default=900.0,
        gt=0,
        le=86400,
        description="give up (503) when a step is refused this long without the agent itself parking",
    )
    unavailable_deadline_s: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="a step whose server is unreachable or answers 503 (the model's worker down) is retried from its "
        "boundary this long; then /run fails with 503 upstream_unavailable (the collection runs it again)",
    )
    unavailable_backoff_s: float = Field(default=0.2, gt=0, le=60, description="first wait before retrying such a step")
    unavailable_backoff_max_s: float = Field(default=5.0, gt=0, le=300, description="longest wait between two retries")
    park_poll_s: float = Field(default=0.02, gt=0, le=1, description="how often a parked episode rechecks admission")
    finished_retention_s: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="keep a finished episode's result this long: a repeated /run gets it again, and a checkpoint "
        "whose scope still lists the rollout (its caller has not got the result) saves it",
    )
    finished_retention_max: int = Field(default=1024, ge=0, le=1_000_000, description="finished results kept at most")
    finished_retention_max_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        le=64 * 1024**3,
        description="and at most this many bytes of them (their JSON size; token ids make a result large); a result "
        "larger than this alone is not kept",
    )
