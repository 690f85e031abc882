"""The routes every NeMo Gym resources server has besides its own: ``/close_session``, ``/reverify_mode``.

NeMo Gym's framework adds them to every resources server's app (before the server's own routes, so
a catch-all tool route never sees them):

- ``POST /close_session`` with ``{resources_session_id, episode_id}`` (an environment server closing
  what it seeded; no other field) answers ``{"resources_session_id": ...}``. A server that keeps its
  state by session cookie, as ours do, has nothing keyed by that id to release: the answer is all.
- ``GET /reverify_mode`` answers how the server's verifications may be re-run: ``"unknown"`` unless
  the server declares otherwise.
- ``POST /aggregate_metrics`` (NeMo Gym's statistics over a run's verify answers) is not served by
  ours: it answers ``404 {"detail":"Not Found"}``, as a path no route has, rather than reaching a
  server's catch-all tool route.

The request models (:class:`EpisodeId`, :class:`TaskId`, :class:`CloseSessionRequest`) are NeMo Gym's
wire format; the Lean server's environment-server seed uses them too.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gym_services.base.nemo_http import json_response, parse
from gym_services.server.openapi import Operation

REVERIFY_UNKNOWN = "unknown"


class EpisodeId(BaseModel):
    """One attempt of a rollout, as NeMo Gym's environment servers name it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    attempt: int = Field(default=0, ge=0)

    @field_validator("rollout_id")
    @classmethod
    def _no_attempt_suffix(cls, value: str) -> str:
        if re.search(r"-a[1-9][0-9]*$", value):
            raise ValueError("rollout_id must not end with the reserved attempt suffix '-a<N>'")
        return value


class TaskId(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class CloseSessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    resources_session_id: str
    episode_id: EpisodeId


async def close_session(request: Request) -> Response:
    """Nothing is kept under a resources session id: the closed id is the answer."""
    closed = await parse(request, CloseSessionRequest)
    return json_response({"resources_session_id": closed.resources_session_id})


def routes(reverify_mode: str = REVERIFY_UNKNOWN) -> list[Route]:
    """``/close_session`` and ``/reverify_mode``, to put before a server's own routes."""

    async def reverify(request: Request) -> Response:
        return json_response(reverify_mode)

    return [
        Route("/close_session", close_session, methods=["POST"]),
        Route("/aggregate_metrics", not_served, methods=["POST"]),
        Route("/reverify_mode", reverify, methods=["GET"]),
    ]


async def not_served(request: Request) -> Response:
    raise HTTPException(404)


#: the paths of :func:`routes` (they hold no state: open while a checkpoint is)
PATHS = ("/close_session", "/aggregate_metrics", "/reverify_mode")


class CloseSessionResponse(BaseModel):
    resources_session_id: str


#: NeMo Gym's aggregate-metrics route, listed as ours answers it
AGGREGATE_METRICS = Operation(
    "POST",
    "/aggregate_metrics",
    "Run statistics (not served)",
    status=404,
    description="NeMo Gym computes a run's statistics over verify answers here; this server does not and "
    'answers 404 {"detail":"Not Found"}.',
)


def operations() -> list[Operation]:
    """:func:`routes` as the API document lists them."""
    return [
        Operation("POST", "/close_session", "Close a resources session", CloseSessionRequest, CloseSessionResponse),
        AGGREGATE_METRICS,
        Operation("GET", "/reverify_mode", "How this server re-verifies", response=str),
    ]
