"""blackjack: a Gymnasium-style environment server, ``/reset`` and ``/step`` (REFERENCE B.4).

Each episode lives under the caller's cookie session id. Its shoe is seeded per episode
(the ``/reset`` body's ``seed``, else derived from the rollout id, else random) and its
position is part of the exported state, so a restored episode deals the same next card
as an uninterrupted one. The participant has role ``environment``; ``/reset``, ``/step``
and ``/close`` are GATED: refused with ``409 checkpoint_parked`` while a checkpoint is
open, and a step already running finishes before prepare answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_services.server.app import create_server_app
from gym_services.base.config import ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body, read_json_object
from gym_services.base.identity import RolloutIdentity
from gym_services.base.sessions import session_id
from gym_services.resources.blackjack.game import MAX_SEED, Episode, parse_action, response_text
from gym_services.resources.blackjack.participant import EpisodeParticipant
from gym_services.resources.blackjack.state import EpisodeStore


class Config(ServerConfig):
    seed_from_rollout_id: bool = Field(
        default=True, description="without a seed in /reset, derive it from x-ng-rollout-id (reproducible deals)"
    )
    seed_namespace: str = Field(default="blackjack", description="mixed into rollout-derived seeds")
    step_latency_s: float = Field(
        default=0.0, ge=0, le=60, description="simulated environment latency per step (tests, demo)"
    )


class ResetRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)


class ResetResponse(BaseModel):
    observation: str
    info: dict[str, Any]


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any] | None = None
    response: dict[str, Any] | str | None = None
    action: str | None = Field(default=None, description="the action text, instead of a model response")
    extra: dict[str, Any] | None = None


class StepResponse(BaseModel):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def derive_seed(namespace: str, rollout_id: str) -> int:
    digest = hashlib.sha256(f"{namespace}:{rollout_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def choose_seed(config: Config, body: ResetRequest, identity: RolloutIdentity | None) -> int:
    """The body's seed, else ``extra.seed``, else one derived from the rollout id, else a random one."""
    if body.seed is not None:
        return body.seed
    extra_seed = (body.extra or {}).get("seed")
    if extra_seed is not None:
        if not isinstance(extra_seed, int) or isinstance(extra_seed, bool) or not 0 <= extra_seed <= MAX_SEED:
            raise ApiError(ErrorCode.BAD_REQUEST, f"extra.seed must be an integer in [0, {MAX_SEED}]")
        return extra_seed
    if identity is not None and config.seed_from_rollout_id:
        return derive_seed(config.seed_namespace, identity.rollout_id)
    return secrets.randbits(64)


def create_app(config: Config) -> Starlette:
    store = EpisodeStore()
    participant = EpisodeParticipant(store)

    def finish(sid: str) -> None:
        store.episodes.pop(sid, None)
        participant.end(sid)

    async def reset(request: Request) -> JSONResponse:
        body = await parse_body(request, ResetRequest)
        sid = session_id(request)
        identity = RolloutIdentity.from_headers(request.headers)
        seed = choose_seed(config, body, identity)
        episode = Episode.deal(seed)
        store.episodes[sid] = episode
        participant.begin(sid, identity)
        reply = ResetResponse(observation=episode.observation(), info={"seed": seed, "supports_explicit_close": True})
        return JSONResponse(reply.model_dump(), headers=participant.seed_headers())

    async def step(request: Request) -> JSONResponse:
        body = await parse_body(request, StepRequest)
        sid = session_id(request)
        participant.check_session(sid)
        if config.step_latency_s:
            await asyncio.sleep(config.step_latency_s)
            participant.check_session(sid)
        episode = store.episodes.get(sid)
        if episode is None:
            raise ApiError(ErrorCode.SESSION_NOT_FOUND, f"no live episode for session {sid}; call /reset first")
        text = body.action if body.action is not None else response_text(body.response)
        result = episode.step(parse_action(text))
        if result.terminated:
            finish(sid)
            request.app.state.blackjack_finished.labels(result=result.info["result"]).inc()
        reply = StepResponse(
            observation=result.observation,
            reward=result.reward,
            terminated=result.terminated,
            truncated=False,
            info=result.info,
        )
        return JSONResponse(reply.model_dump())

    async def close(request: Request) -> JSONResponse:
        await read_json_object(request)  # no fields, but it must be well-formed
        sid = session_id(request)
        participant.check_session(sid)
        had = sid in store.episodes
        finish(sid)
        return JSONResponse({"closed": had})

    app = create_server_app(
        config,
        participant,
        [
            Route("/reset", reset, methods=["POST"]),
            Route("/step", step, methods=["POST"]),
            Route("/close", close, methods=["POST"]),
        ],
    )
    app.state.blackjack_finished = app.state.metrics.counter(
        "gym_blackjack_episodes_finished", "Finished Blackjack episodes by result", ("result",)
    )
    app.state.episodes = store
    return app
