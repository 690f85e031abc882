"""A NeMo Gym resources server as a participant, built and served by ``gymckpt serve`` (``docs/authoring.md``).

The lines an author adds at the end of the server's own ``app.py``::

    from gym_services.adapters.nemo_gym import SessionDict, adopt

    Config, create_app = adopt(StatefulCounterResourcesServer, SessionDict("session_id_to_counter"))

and it runs with ``gymckpt serve my_env.app:create_app`` (or in a stack YAML, ``server: my_env.app:create_app``).
:func:`adopt` returns the config class (:class:`NemoGymConfig`: the fields every server has, and ``nemo_gym``, the
NeMo Gym server's own config fields) and ``create_app``, which makes the server object, assembles its FastAPI app
as NeMo Gym's ``run_webserver`` does (its routes, liveness routes, exception and cancellation middleware, request
validation answers) and mounts the control plane into it (:func:`participate`). Nothing of NeMo Gym is imported until
``create_app`` runs: this package does not depend on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.middleware import Middleware

from gym_services.adapters.control import mount_control_plane
from gym_services.adapters.nemo_gym.sessions import NemoSessions
from gym_services.adapters.nemo_gym.state import NemoSessionHooks, SessionDict
from gym_services.base.config import ServerConfig
from gym_services.control.admission import RoutePolicy, policy_table
from gym_services.control.plane import ControlPlane
from gym_services.control.protocol import VerifyMode
from gym_services.resources.common.participant import ExportedParticipant

#: NeMo Gym's liveness routes (``setup_liveness``) and FastAPI's documentation: no session, never gated
NEMO_PUBLIC_PATHS = (
    "/",
    "/health",
    "/healthz",
    "/livez",
    "/readyz",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/openapi.json",
)
#: the framework's routes that hold no session state: served while a checkpoint is open
NEMO_STATELESS_ROUTES = ("/reverify_mode", "/aggregate_metrics")


class HeadServer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str
    port: int = Field(ge=1, le=65535)


class NemoGymConfig(ServerConfig):
    nemo_gym: dict[str, Any] = Field(
        default_factory=dict, description="the NeMo Gym server's own config fields (besides host, port and name)"
    )
    nemo_gym_head: HeadServer | None = Field(
        default=None,
        description="NeMo Gym's head server, for a server that calls other servers of a NeMo Gym deployment "
        "(its global config is read from there); none: the server calls no other",
    )


def adopt(
    server_class: type, state: SessionDict, *, config_class: type[NemoGymConfig] = NemoGymConfig
) -> tuple[type[NemoGymConfig], Callable[[NemoGymConfig], Starlette]]:
    """The ``Config`` and ``create_app`` of ``server_class`` (a NeMo Gym ``SimpleResourcesServer``) as a
    participant whose per-session state is ``state``."""

    def create_app(config: NemoGymConfig) -> Starlette:
        server = nemo_server(server_class, config)
        app: Starlette = nemo_app(server)
        participate(app, server, config, state)
        return app

    create_app.__qualname__ = f"create_app[{server_class.__name__}]"
    return config_class, create_app


def nemo_server(server_class: type, config: NemoGymConfig) -> Any:
    """The NeMo Gym server object, its config made from ``config`` (``name``, ``host``, ``port`` and ``nemo_gym``)."""
    from nemo_gym.config_types import BaseServerConfig
    from nemo_gym.server_utils import ServerClient
    from omegaconf import OmegaConf

    config_type: Any = server_class.model_fields["config"].annotation  # type: ignore[attr-defined]
    fields = config_type.model_validate(
        {"entrypoint": "app.py", **config.nemo_gym, "name": config.name, "host": config.host, "port": config.port}
    )
    if config.nemo_gym_head is not None:
        head = BaseServerConfig(host=config.nemo_gym_head.host, port=config.nemo_gym_head.port)
        client = ServerClient.load_from_global_config(head)
    else:
        head = BaseServerConfig(host=config.host, port=config.port)
        client = ServerClient(head_server_config=head, global_config_dict=OmegaConf.create({}))
    return server_class(config=fields, server_client=client)


def nemo_app(server: Any) -> Any:
    """The server's FastAPI app, assembled in the order of NeMo Gym's ``SimpleServer.run_webserver`` (without
    uvicorn, telemetry and the process-wide settings it also makes)."""
    from fastapi.exceptions import RequestValidationError
    from nemo_gym import server_utils

    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    server.setup_cancellation_middleware(app)
    validation = getattr(server_utils, "_validation_exception_handler", None)
    if validation is not None:  # NeMo Gym's 422 answer for a body that does not validate
        app.exception_handler(RequestValidationError)(validation)
    return app


def participate(app: Starlette, server: Any, config: ServerConfig, state: SessionDict) -> ControlPlane[Any, Any]:
    """Mount the control plane into the adopted server's ``app``: its sessions (NeMo Gym's cookie) saved through
    ``state``, its data routes behind admission and the attempt fence."""
    hooks = NemoSessionHooks(server, state)
    participant: ExportedParticipant[dict[str, Any]] = ExportedParticipant(hooks, verify=VerifyMode.WAIT)
    hooks.tracked = lambda: list(participant.sessions)
    return mount_control_plane(
        app,
        config,
        participant,
        policies=policy_table({path: RoutePolicy.OPEN for path in NEMO_STATELESS_ROUTES}),
        data_middleware=[Middleware(NemoSessions, participant=participant, hooks=hooks)],
        bypass=NEMO_PUBLIC_PATHS,
    )
