"""One storage client per location and access, and the thread pool their blocking calls run in.

Owned by the control plane (:mod:`gym_services.control.plane`): capture and restore name a location
and may carry a :class:`~gym_services.control.models.StorageAccess` that overrides the server's
``storage`` config for that call.

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
from gym_services.control.models import StorageAccess
from gym_services.control.storage import Storage, StorageError, open_storage

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
        #: one client per location and access (the access's values, keys included, tell clients apart)
        self._clients: dict[tuple[str, tuple[tuple[str, str], ...]], Storage] = {}
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

    def get(self, location: str, access: StorageAccess | None = None) -> Storage:
        """The client for a location, from the server's config or the request's access; 400 for a bad location.

        No I/O and no boto3 client here: safe under the pause.
        """
        key = (location, tuple(sorted(access.wire().items())) if access else ())
        if key not in self._clients:
            config = self.config
            if access is not None:
                config = config.model_copy(update=access.model_dump(exclude_none=True))
            try:
                self._clients[key] = open_storage(location, config, lambda c: self.s3_clients(c))
            except StorageError as exc:
                raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        return self._clients[key]

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
