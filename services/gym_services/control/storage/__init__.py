"""Checkpoint storage: one small interface, a ``file://`` and an ``s3://`` backend (DESIGN §7)."""

from gym_services.control.storage.base import (
    AlreadyExists,
    NotFound,
    Storage,
    StorageError,
    open_storage,
)

__all__ = ["AlreadyExists", "NotFound", "Storage", "StorageError", "open_storage"]
