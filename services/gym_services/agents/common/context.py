"""What a step may do: call the model through the agent's own proxy, or a downstream server."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gym_services.agents.common.boundary import Boundary
from gym_services.agents.common.downstream import Downstream, Reply, json_bytes
from gym_services.agents.common.tokens import LEDGER_CALL_HEADER, EpisodeTokens, is_triple
from gym_services.base import token_codec
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import RolloutIdentity
from gym_services.base.sessions import cookie_name
from gym_services.base.tokens import FIELDS, Tokens

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
        tokens: EpisodeTokens | None = None,
        model: Downstream | None = None,
    ) -> None:
        self.identity = identity
        self.self_proxy = self_proxy
        self.servers = servers
        self.own_cookie = own_cookie
        self.in_flight = in_flight if in_flight is not None else InFlight()
        self.tokens = tokens if tokens is not None else EpisodeTokens()
        self.model = model

    async def generate(self, boundary: Boundary, params: dict[str, Any]) -> Reply:
        """``POST /v1/responses`` through the agent's own proxy with the episode's model cookies. The answer's
        token fields become the episode's token arrays, named by the ledger call that recorded them, if any.

        ``params`` are written as the call's body at once and not held while the generation runs (a validated copy
        of the task's create params, its tools included: thousands of episodes wait on the model at once); the
        caller passes them without keeping them."""
        content = json_bytes(params)
        del params
        reply = await self.self_proxy.post(
            "/v1/responses", content, identity=self.identity, cookies=boundary.cookies.get(MODEL, {})
        )
        reply.cookies.pop(self.own_cookie, None)  # the proxy's own session cookie is not the model's
        output = reply.body.get("output") if isinstance(reply.body, dict) else None
        call = reply.headers.get(LEDGER_CALL_HEADER)
        for item in output if isinstance(output, list) else []:
            if isinstance(item, dict) and is_triple(item):
                try:
                    prompt, generated, log_probs = (item[f] for f in FIELDS)
                    triple = self.tokens.add(prompt, generated, log_probs, call)
                except (TypeError, ValueError, OverflowError):
                    continue  # not token ids: left as given
                item.update(zip(FIELDS, triple.arrays(), strict=True))
                call = None  # the ledger entry holds the first such item's tokens (as NeMo Gym moves them)
        return reply

    async def read_ledger(self, calls: list[str]) -> list[Tokens]:
        """The tokens the policy model's token ledger holds for these calls of this rollout, in order
        (``POST /v1/ledger/tokens``: a restored episode reads back what its checkpoint named)."""
        if self.model is None or self.identity is None:
            raise ApiError(ErrorCode.INTERNAL, "this episode has no policy model to read its tokens from")
        body = {"rollout_id": self.identity.rollout_id, "model_call_ids": calls}
        reply = await self.model.post("/v1/ledger/tokens", body, identity=self.identity, cookies={})
        try:
            return token_codec.decode_all(reply.content, len(calls))
        except token_codec.TokenCodecError as exc:
            raise ApiError(ErrorCode.UPSTREAM_ERROR, f"model /v1/ledger/tokens: {exc}") from None

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
        """``POST`` to a configured downstream server with the episode's cookies for it. The token fields of the
        episode's calls an answer echoes (``/verify`` answers with the response it was sent) become the episode's arrays
        at once: the lists of Python ints the answer was parsed into are let go before anything copies them."""
        downstream = self.servers[server]
        self.in_flight.server, self.in_flight.since = server, time.monotonic()
        self.in_flight.url = f"{downstream.url_for(self.identity)}{path}"
        try:
            reply = await downstream.post(
                path,
                body,
                identity=self.identity,
                cookies=boundary.cookies.get(server, {}),
                accept_client_errors=accept_client_errors,
                accept_errors=accept_errors,
            )
        finally:
            self.in_flight.server = self.in_flight.url = None
        if isinstance(reply.body, (dict, list)):
            self.tokens.intern(reply.body, known=True)
        return reply


def own_cookie_name(server_name: str) -> str:
    return cookie_name(server_name)
