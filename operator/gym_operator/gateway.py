"""The storage gateway: signs, one object at a time, the requests a server makes with its storage grant.

Every replica of the operator serves it (``gym-operator --storage-gateway http://0.0.0.0:8081``), leading or
standing by: a grant is an HMAC-signed token any replica verifies with the release's gateway key
(``GYMCKPT_GATEWAY_KEY``), so a failover between a capture and its persist costs nothing. The keys of a location
are read here, from its ``credential`` Secret (kept :data:`SECRET_CACHE_S`), else the operator's own environment;
they never leave this process. What a grant covers, and why presigned requests:
:mod:`gym_services.control.storage.gateway` and ``docs/decisions.md``.

``POST /storage/v1/sign`` with a :class:`~gym_services.control.storage.gateway.SignRequest`: 200 and a
:class:`~gym_services.control.storage.gateway.SignedRequest`; 403 for a grant that is forged, expired or does not
cover the key; 400 for a malformed request; 503 when the location's Secret cannot be read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp.web
from pydantic import ValidationError

from gym_operator.kube import Kube, KubeError
from gym_services.base.config import StorageConfig
from gym_services.control.storage import StorageError
from gym_services.control.storage.gateway import (
    SIGN_PATH,
    GrantRefused,
    GrantSigner,
    SignRequest,
    Target,
    presign,
    storage_config_of,
)
from gym_services.control.storage.s3 import SharedClients

log = logging.getLogger("gym.operator.gateway")

#: seconds a location's Secret is kept before it is read again (keys rotated in the Secret take effect by then)
SECRET_CACHE_S = 30.0


def _error(status: int, code: str, message: str) -> aiohttp.web.Response:
    body = {"error": {"code": code, "message": message}}
    return aiohttp.web.Response(status=status, text=json.dumps(body), content_type="application/json")


class Gateway:
    """The signing route of one operator process."""

    def __init__(self, signer: GrantSigner, kube: Kube, namespace: str, default: StorageConfig) -> None:
        self.signer, self.kube, self.namespace, self.default = signer, kube, namespace, default
        self.clients = SharedClients()
        self._secrets: dict[str, tuple[float, dict[str, str]]] = {}
        self.signed = 0
        self.refused = 0

    async def _keys(self, target: Target) -> dict[str, str] | None:
        if not target.credential:
            return None
        cached = self._secrets.get(target.credential)
        if cached is not None and time.monotonic() - cached[0] < SECRET_CACHE_S:
            return cached[1]
        data = await self.kube.secret_data(self.namespace, target.credential)
        self._secrets[target.credential] = (time.monotonic(), data)
        return data

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        try:
            asked = SignRequest.model_validate(await request.json())
        except (ValueError, ValidationError) as exc:
            return _error(400, "bad_request", f"not a signing request: {exc}")
        try:
            grant = self.signer.verify(asked.token)
            target = grant.target_for(asked.access, asked.key)
        except GrantRefused as exc:
            self.refused += 1
            log.warning(f"storage gateway refused {asked.access} of {asked.key}: {exc}")
            return _error(403, "grant_refused", str(exc))
        try:
            config = storage_config_of(target, await self._keys(target), self.default)
            client = await asyncio.to_thread(self.clients, config)
            signed = presign(client, target, asked.access, asked.key)
        except (LookupError, KeyError) as exc:
            return _error(503, "credentials_unavailable", f"the keys of {target.url} cannot be read: {exc}")
        except (KubeError, StorageError) as exc:
            return _error(503, "storage_unavailable", f"cannot sign for {target.url}: {exc}")
        self.signed += 1
        return aiohttp.web.Response(text=signed.model_dump_json(), content_type="application/json")

    def routes(self, app: aiohttp.web.Application) -> None:
        app.router.add_post(SIGN_PATH, self.handle)


async def serve(gateway: Gateway, host: str, port: int) -> aiohttp.web.AppRunner:
    """The gateway on its own port (the servers' NetworkPolicy may reach this one, not the liveness port)."""
    app = aiohttp.web.Application(client_max_size=64 * 1024)
    gateway.routes(app)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, host, port).start()
    return runner
