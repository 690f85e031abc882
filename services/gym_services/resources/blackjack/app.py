"""blackjack: a Gymnasium-style environment server, ``/reset`` and ``/step`` (see the README).

Answers like NeMo Gym 0.7.0's blackjack server (``resources_servers/blackjack``, a
``GymnasiumServer``): the same request models (``responses_create_params``, and for ``/step`` a
``response``, validated as NeMo Gym validates them; FastAPI's ``422`` bodies otherwise), the same
game, observations and rewards, compact JSON bodies. What differs is what checkpointing needs:

- the deal is reproducible: each episode's shoe is seeded (the body's ``seed``, else derived from the
  rollout id, else random; reported in the ``x-ng-blackjack-seed`` header) where the reference's is
  an unseeded generator; a malformed ``seed`` is refused with ``400``;
- a ``/step`` whose session has no live episode (never reset, finished, retired, or lost with a
  process that was not checkpointed) is ``404 session_not_found`` where the reference plays an
  empty hand against a fresh dealer (or fails with a 500);
- ``409 checkpoint_parked`` / ``409 stale_attempt`` from the control plane.

Each episode lives under the caller's cookie session id and its shoe position is part of the
exported state, so a restored episode deals the same next card as an uninterrupted one. The
participant has role ``environment``; ``/reset`` and ``/step`` are GATED: refused with ``409
checkpoint_parked`` while a checkpoint is open, and a step already running finishes before prepare
answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.base.metrics import Metrics
from gym_services.base.nemo_http import json_response, parse, repr_error
from gym_services.base.nemo_responses import CreateParams, ResponseObject, UnreadableOutput
from gym_services.base.sessions import session_id
from gym_services.resources.blackjack.game import MAX_SEED, Episode, parse_action
from gym_services.resources.blackjack.participant import EpisodeParticipant
from gym_services.resources.blackjack.state import EpisodeStore
from gym_services.resources.common import nemo_routes
from gym_services.server.app import create_server_app, held
from gym_services.server.openapi import Operation

SEED_HEADER = "x-ng-blackjack-seed"


class Config(ServerConfig):
    seed_from_rollout_id: bool = Field(
        default=True, description="without a seed in /reset, derive it from x-ng-rollout-id (reproducible deals)"
    )
    seed_namespace: str = Field(default="blackjack", description="mixed into rollout-derived seeds")
    step_latency_s: float = Field(
        default=0.0, ge=0, le=60, description="simulated environment latency per step (tests, demo)"
    )


class ResetRequest(BaseModel):
    """NeMo Gym's Gymnasium reset body: ``responses_create_params`` and any other fields (our ``seed``)."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: CreateParams


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    responses_create_params: CreateParams
    response: ResponseObject


class ResetResponse(BaseModel):
    observation: str | None
    info: dict[str, Any]


class StepResponse(BaseModel):
    observation: str | None
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


@dataclass(frozen=True)
class BlackjackMetrics:
    finished: Counter

    @classmethod
    def declare(cls, metrics: Metrics) -> BlackjackMetrics:
        return cls(
            metrics.counter("gym_blackjack_episodes_finished", "Finished Blackjack episodes by result", ("result",))
        )


def derive_seed(namespace: str, rollout_id: str) -> int:
    digest = hashlib.sha256(f"{namespace}:{rollout_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _valid_seed(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED


def choose_seed(config: Config, body: ResetRequest, identity: RolloutIdentity | None) -> int:
    """The body's ``seed``, else ``extra.seed``, else one derived from the rollout id, else a random one."""
    fields = body.model_extra or {}
    if "seed" in fields and fields["seed"] is not None:
        if not _valid_seed(fields["seed"]):
            raise ApiError(ErrorCode.BAD_REQUEST, f"seed must be an integer in [0, {MAX_SEED}]")
        seed: int = fields["seed"]
        return seed
    extra = fields.get("extra")
    extra_seed: int | None = extra.get("seed") if isinstance(extra, dict) else None
    if extra_seed is not None:
        if not _valid_seed(extra_seed):
            raise ApiError(ErrorCode.BAD_REQUEST, f"extra.seed must be an integer in [0, {MAX_SEED}]")
        return extra_seed
    if identity is not None and config.seed_from_rollout_id:
        return derive_seed(config.seed_namespace, identity.rollout_id)
    return secrets.randbits(64)


def no_episode(sid: str) -> ApiError:
    return ApiError(ErrorCode.SESSION_NOT_FOUND, f"no live episode for session {sid}; call /reset first")


@dataclass(frozen=True)
class Blackjack:
    """The server's state, held on ``app.state.held`` for its endpoints."""

    config: Config
    store: EpisodeStore
    participant: EpisodeParticipant
    counts: BlackjackMetrics


async def reset(request: Request) -> Response:
    server = held(request, Blackjack)
    body = await parse(request, ResetRequest)
    identity = RolloutIdentity.from_headers(request.headers)
    seed = choose_seed(server.config, body, identity)
    episode = Episode.deal(seed)
    await server.participant.seed(request, lambda sid: server.store.start(sid, episode))
    headers = {**server.participant.seed_headers(), SEED_HEADER: str(seed)}
    return json_response({"observation": episode.observation(), "info": {}}, headers=headers)


async def step(request: Request) -> Response:
    server = held(request, Blackjack)
    participant = server.participant
    body = await parse(request, StepRequest)
    if server.config.step_latency_s:
        participant.check_session(session_id(request))
        await asyncio.sleep(server.config.step_latency_s)
    sid, episode = participant.session(request, server.store.episodes.get, missing=no_episode)
    try:
        text = body.response.message_text()
    except UnreadableOutput as exc:  # the reference fails reading such a response: 500 with the error's repr
        return repr_error(AttributeError(*exc.args))
    result = episode.step(parse_action(text))
    if result.terminated:
        server.store.episodes.pop(sid, None)
        participant.end(sid)
        server.counts.finished.labels(result=result.info["result"]).inc()
    reply = StepResponse(
        observation=result.observation,
        reward=result.reward,
        terminated=result.terminated,
        truncated=False,
        info=result.info,
    )
    return json_response(reply.model_dump(mode="json"))


def create_app(config: Config) -> Starlette:
    store = EpisodeStore()
    participant = EpisodeParticipant(store)
    metrics = Metrics(config.name)
    counts = BlackjackMetrics.declare(metrics)
    app = create_server_app(
        config,
        participant,
        [
            Route("/reset", reset, methods=["POST"]),
            Route("/step", step, methods=["POST"]),
        ],
        metrics=metrics,
        nemo_gym=True,
        api=[
            Operation("POST", "/reset", "Deal a new game (seeded by the body's seed)", ResetRequest, ResetResponse),
            Operation("POST", "/step", "Apply the model's move", StepRequest, StepResponse),
            nemo_routes.AGGREGATE_METRICS,
        ],
        api_title="blackjack (NeMo Gym 0.7.0 Gymnasium environment)",
    )
    app.state.held = Blackjack(config, store, participant, counts)
    app.state.episodes = store
    return app
