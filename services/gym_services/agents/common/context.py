"""What a step may do: call the model through the agent's own proxy, or a downstream server."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gym_services.agents.common.boundary import Boundary
from gym_services.agents.common.downstream import Downstream, Reply
from gym_services.base.identity import RolloutIdentity
from gym_services.base.sessions import cookie_name

#: the downstream name of the policy model (its cookies in a boundary are kept under this name)
MODEL = "model"


@dataclass
class InFlight:
    """The downstream server call an episode's step is making now: a checkpoint's blocker names that server."""

    server: str | None = None  # its name here (``resources``, ``env``)
    url: str | None = None  # what was called: the replica's base URL and the path
    since: float = 0.0


class StepContext:
    """Calls made on behalf of one episode attempt, carrying its identity and cookies."""

    def __init__(
        self,
        identity: RolloutIdentity | None,
        self_proxy: Downstream,
        servers: dict[str, Downstream],
        own_cookie: str,
        in_flight: InFlight | None = None,
    ) -> None:
        self.identity = identity
        self.self_proxy = self_proxy
        self.servers = servers
        self.own_cookie = own_cookie
        self.in_flight = in_flight if in_flight is not None else InFlight()

    async def generate(self, boundary: Boundary, params: dict[str, Any]) -> Reply:
        """``POST /v1/responses`` through the agent's own proxy with the episode's model cookies."""
        reply = await self.self_proxy.post(
            "/v1/responses", params, identity=self.identity, cookies=boundary.cookies.get(MODEL, {})
        )
        reply.cookies.pop(self.own_cookie, None)  # the proxy's own session cookie is not the model's
        return reply

    async def call(
        self,
        server: str,
        path: str,
        body: Any,
        boundary: Boundary,
        *,
        accept_client_errors: bool = False,
        accept_errors: bool = False,
    ) -> Reply:
        """``POST`` to a configured downstream server with the episode's cookies for it."""
        downstream = self.servers[server]
        self.in_flight.server, self.in_flight.since = server, time.monotonic()
        self.in_flight.url = f"{downstream.url_for(self.identity)}{path}"
        try:
            return await downstream.post(
                path,
                body,
                identity=self.identity,
                cookies=boundary.cookies.get(server, {}),
                accept_client_errors=accept_client_errors,
                accept_errors=accept_errors,
            )
        finally:
            self.in_flight.server = self.in_flight.url = None


def own_cookie_name(server_name: str) -> str:
    return cookie_name(server_name)
