"""Checkpoint storage: one small interface (:mod:`.base`), a ``file://``, an ``s3://`` and an in-memory backend,
and :func:`open_storage` to open a location by its URL (:mod:`.locations`).

Layout and guarantees: ``docs/protocol.md``, "Records and manifests". Opened by the control plane
(:mod:`gym_services.control.storage_clients`), the coordinator, the CLI and the operator. The modules here import
:mod:`.base` and nothing above it; this package's front door imports them, never the other way round.
"""

from gym_services.control.storage.base import AlreadyExists, NotFound, Storage, StorageError
from gym_services.control.storage.locations import open_storage
from gym_services.control.storage.memory import MemoryStorage

__all__ = ["AlreadyExists", "MemoryStorage", "NotFound", "Storage", "StorageError", "open_storage"]
