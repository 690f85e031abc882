"""Checkpoint storage: one small interface, a ``file://`` and an ``s3://`` backend.

Layout and guarantees: ``docs/protocol.md``, "Records and manifests". Opened by the control plane
(:mod:`gym_services.control.storage_clients`) and the coordinator.
"""

from gym_services.control.storage.base import (
    AlreadyExists,
    NotFound,
    Storage,
    StorageError,
    open_storage,
)

__all__ = ["AlreadyExists", "NotFound", "Storage", "StorageError", "open_storage"]
