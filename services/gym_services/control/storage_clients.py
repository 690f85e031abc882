"""One storage client per location and access, and the thread pool their blocking calls run in.

Owned by the control plane (:mod:`gym_services.control.plane`): capture and restore name a location
and may carry a :class:`~gym_services.control.models.StorageAccess` that overrides the server's
``storage`` config for that call.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from gym_services.base.config import StorageConfig
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.control.models import StorageAccess
from gym_services.control.storage import Storage, StorageError, open_storage


class StorageClients:
    def __init__(self, config: StorageConfig, server: str) -> None:
        self.config = config
        #: one client per location and access (the access's values, keys included, tell clients apart)
        self._clients: dict[tuple[str, tuple[tuple[str, str], ...]], Storage] = {}
        self.pool = ThreadPoolExecutor(max_workers=config.max_concurrency, thread_name_prefix=f"storage-{server}")

    def get(self, location: str, access: StorageAccess | None = None) -> Storage:
        """The client for a location, from the server's config or the request's access; 400 for a bad location."""
        key = (location, tuple(sorted(access.wire().items())) if access else ())
        if key not in self._clients:
            config = self.config
            if access is not None:
                config = config.model_copy(update=access.model_dump(exclude_none=True))
            try:
                self._clients[key] = open_storage(location, config)
            except StorageError as exc:
                raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        return self._clients[key]

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
