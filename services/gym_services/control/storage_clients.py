"""One storage client per location and access, and the thread pool their blocking calls run in.

Owned by the control plane (:mod:`gym_services.control.plane`): capture and restore name a location
and may carry a :class:`~gym_services.control.models.StorageGrant`: then the server reaches that location only
through the storage gateway its own config names (``storage.gateway_url``), each object signed for it
(:mod:`gym_services.control.storage.gateway`), and never with keys of its own. A request names no endpoint and
no keys: a server reaches no storage it was not configured for.

Nothing here is made under a checkpoint's pause. A boto3 client costs about a second of CPU the first
time in a process (importing boto3, loading the S3 service model, resolving credentials) and ~30 ms
from a warm session; the first checkpoint of a fresh server on S3 paused 1.2-2.9 s making one inside
``capture``. So:

- :meth:`StorageClients.warm` (server start-up, before the server reports ready) imports boto3 and
  makes the client for the server's own ``storage`` config when the server is set up for S3;
- :meth:`StorageClients.get` only parses a location: an ``s3://`` location shares the boto3 client
  of its access (endpoint, region, keys), fetched or made on its first request, which for a capture
  is the background persist after resume.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gym_services.base.config import StorageConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.logs import get_logger
from gym_services.control.models import StorageGrant
from gym_services.control.storage import Storage, StorageError, open_storage
from gym_services.control.storage.gateway import GatewayHttp, GatewayStorage

log = get_logger("control")
#: any of these set means the server is meant to reach S3: its client is made at start-up
S3_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
)


def uses_s3(config: StorageConfig) -> bool:
    """Whether the server's storage config (or the standard AWS variables) point at S3."""
    return bool(config.endpoint_url or config.region or config.access_key_id) or any(
        os.environ.get(v) for v in S3_VARIABLES
    )


class StorageClients:
    def __init__(self, config: StorageConfig, server: str) -> None:
        self.config = config
        #: one client per location from the server's own config
        self._clients: dict[str, Storage] = {}
        self.gateway = GatewayHttp(config.max_concurrency)  # the storage gateway's connections, when grants come
        self._s3_clients: Any = None  # one boto3 client per access, shared by every location reached with it
        self.pool = ThreadPoolExecutor(max_workers=config.max_concurrency, thread_name_prefix=f"storage-{server}")

    @property
    def s3_clients(self) -> Any:
        """This server's :class:`~gym_services.control.storage.s3.SharedClients` (botocore imported on first use)."""
        if self._s3_clients is None:
            from gym_services.control.storage.s3 import SharedClients

            self._s3_clients = SharedClients()
        return self._s3_clients

    def warm(self) -> bool:
        """Make the S3 client of the server's own config now (blocking: run it in a thread at start-up).

        Only for a server set up for S3 (:func:`uses_s3`); a file-only server never imports boto3.
        Returns whether it made one. A config botocore refuses is reported when a location is used.
        """
        if not uses_s3(self.config):
            return False
        try:
            self.s3_clients(self.config)
        except StorageError as exc:
            log.warning(f"no S3 client made at start-up: {exc}")
            return False
        return True

    def get(self, location: str, grant: StorageGrant | None = None) -> Storage:
        """The client for a location: through the storage gateway with ``grant``, else from the server's config;
        400 for a bad location, or a grant this server has no gateway for.

        No I/O and no boto3 client here: safe under the pause.
        """
        if grant is not None:
            if not self.config.gateway_url:
                raise ApiError(
                    ErrorCode.BAD_REQUEST,
                    "this request carries a storage grant, but this server has no storage gateway configured "
                    "(storage.gateway_url); it reaches only the storage its own config names",
                )
            if not location.startswith("s3://"):
                raise ApiError(ErrorCode.BAD_REQUEST, f"a storage grant is for an s3:// location, not {location!r}")
            return GatewayStorage(location, self.config.gateway_url, grant, self.gateway.client)
        if location not in self._clients:
            try:
                self._clients[location] = open_storage(location, self.config, lambda c: self.s3_clients(c))
            except StorageError as exc:
                raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        return self._clients[location]

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.gateway.close()
