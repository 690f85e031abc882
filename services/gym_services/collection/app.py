"""The rollout-collection server (role ``controller``): ``POST /jobs`` starts a collection."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from pydantic import Field, SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gym_services.base.affinity import Endpoints
from gym_services.base.config import ConfigError, ServerConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.http import parse_body
from gym_services.collection.files import confine, read_results, receive_tasks
from gym_services.collection.models import JobSpec
from gym_services.collection.runner import Collection
from gym_services.control.admission import RoutePolicy
from gym_services.control.routes import check_token
from gym_services.server.app import create_server_app, held


class Config(ServerConfig):
    agents: dict[str, Endpoints] = Field(
        default_factory=dict,
        description="agent name -> base URL, or its replicas' URLs in ordinal order (each rollout runs on one of them)",
    )
    default_agent: str | None = Field(default=None, description="agent for tasks that name none")
    request_timeout_s: float = Field(default=3600.0, gt=0, description="seconds one /run of an agent may take")
    unavailable_deadline_s: float = Field(
        default=900.0,
        gt=0,
        le=7 * 86400,
        description="an episode whose agent is unreachable, breaks off /run or answers 503 (a server behind it was "
        "down) is run again (attempt + 1 when it may have started) for this long; then an error row is written",
    )
    stall_warning_s: float = Field(
        default=60.0, gt=0, le=86400, description="log a warning when no episode finished for this long (and again)"
    )
    downstream_poll_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="how often, while episodes are live, the agents running them are asked which servers behind them "
        "they are waiting for (GET /health/downstream; shown in /jobs/current)",
    )
    unavailable_backoff_s: float = Field(default=0.2, gt=0, le=60, description="first wait before running it again")
    unavailable_backoff_max_s: float = Field(default=5.0, gt=0, le=600, description="longest wait between two runs")
    data_dir: str | None = Field(
        default=None,
        description="folder for uploaded tasks and results (a PersistentVolume on Kubernetes); when set, relative job "
        "paths are relative to it, and PUT /tasks/NAME.jsonl and GET /jobs/current/results work",
    )
    job_dirs: list[str] = Field(
        default_factory=list,
        description="other folders a job's tasks_path and output_path may lie in (relative: to the server's working "
        "directory); a path outside data_dir and these is 403, and with neither set every job is",
    )
    job_token: SecretStr | None = Field(
        default=None,
        description="bearer token of /jobs and /tasks (GYMCKPT_JOB_TOKEN); the control token when unset",
    )
    max_upload_mb: int = Field(default=2048, ge=1, le=1 << 20, description="largest tasks file PUT /tasks accepts")


def job_token(config: Config) -> str:
    """The bearer token of the job routes: ``job_token``, else the control token."""
    for secret in (config.job_token, config.checkpoint.control_token):
        if secret is not None and secret.get_secret_value():
            return secret.get_secret_value()
    raise ConfigError(
        f"server {config.name!r} needs job_token (or GYMCKPT_JOB_TOKEN) or checkpoint.control_token: "
        "job submission is authenticated"
    )


@dataclass(frozen=True)
class Collector:
    """The server's state, held on ``app.state.held`` for its endpoints."""

    config: Config
    token: str
    collection: Collection

    @property
    def roots(self) -> list[str]:
        """Where task and result paths may be."""
        return [d for d in [self.config.data_dir, *self.config.job_dirs] if d]

    def data_dir(self) -> str:
        if self.config.data_dir is None:
            raise ApiError(
                ErrorCode.NOT_FOUND, "this collection server has no data_dir: give task and result paths it can read"
            )
        return self.config.data_dir


def authorized(request: Request) -> Collector:
    """The server's state, once the request carries the job token."""
    server = held(request, Collector)
    check_token(request.headers.get("authorization", ""), server.token, "job")
    return server


async def start(request: Request) -> JSONResponse:
    server = authorized(request)
    spec = await parse_body(request, JobSpec)
    spec = spec.model_copy(
        update={
            "tasks_path": confine(server.roots, spec.tasks_path, "tasks_path"),
            "output_path": confine(server.roots, spec.output_path, "output_path"),
        }
    )
    return JSONResponse(server.collection.start(spec).model_dump())


async def current(request: Request) -> JSONResponse:
    return JSONResponse(authorized(request).collection.status().model_dump())


async def upload(request: Request) -> JSONResponse:
    server = authorized(request)
    data_dir = server.data_dir()
    limit = server.config.max_upload_mb << 20
    return JSONResponse(await receive_tasks(request, data_dir, request.path_params["name"], limit))


async def results(request: Request) -> StreamingResponse:
    server = authorized(request)
    server.data_dir()
    collection = server.collection
    job = collection.job
    if job is None:
        raise ApiError(ErrorCode.NOT_FOUND, "no collection job has run on this server")
    status = collection.status()
    headers = {"x-gymckpt-job-state": status.state, "x-gymckpt-results": str(len(job.finished))}
    return StreamingResponse(
        read_results(job.spec.output_path, job.output_offset), media_type="application/x-ndjson", headers=headers
    )


def create_app(config: Config, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    token = job_token(config)
    collection = Collection(
        config.agents,
        default_agent=config.default_agent,
        request_timeout_s=config.request_timeout_s,
        unavailable_deadline_s=config.unavailable_deadline_s,
        backoff_s=config.unavailable_backoff_s,
        backoff_max_s=config.unavailable_backoff_max_s,
        stall_warning_s=config.stall_warning_s,
        downstream_poll_s=config.downstream_poll_s,
        transport=transport,
    )
    app = create_server_app(
        config,
        collection,
        [
            Route("/jobs", start, methods=["POST"]),
            Route("/jobs/current", current, methods=["GET"]),
            Route("/jobs/current/results", results, methods=["GET"]),
            Route("/tasks/{name}", upload, methods=["PUT"]),
        ],
        policies={
            "/jobs/current": RoutePolicy.OPEN,
            "/jobs/current/results": RoutePolicy.OPEN,
            "/tasks/*": RoutePolicy.OPEN,
        },
        on_shutdown=[collection.close],
        streamed_paths=("/tasks/",),  # streamed to disk under max_upload_mb
    )
    app.state.held = Collector(config, token, collection)
    return app
