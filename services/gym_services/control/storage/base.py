"""The storage interface every backend implements.

Keys are ``/``-separated paths relative to the location's prefix. Methods are
synchronous (boto3 is); async callers run them in threads.
"""

from __future__ import annotations

import abc
import builtins
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from gym_services.base.config import StorageConfig

KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]*(/[A-Za-z0-9][A-Za-z0-9._=-]*)*$")


class StorageError(Exception):
    """Storage could not do what was asked; the message says where."""


class NotFound(StorageError):
    """No object at that key."""


class AlreadyExists(StorageError):
    """A conditional put found an object already there."""


def check_key(key: str) -> str:
    if not KEY_PATTERN.match(key) or ".." in key.split("/"):
        raise StorageError(f"invalid storage key {key!r}")
    return key


class Storage(abc.ABC):
    """A checkpoint location: ``s3://bucket/prefix`` or ``file:///path``."""

    url: str

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write (or replace) an object atomically: readers see the old or the new bytes, never a mix."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> None:
        """Write an object only if none exists; :class:`AlreadyExists` otherwise."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; :class:`NotFound` when there is none."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def size(self, key: str) -> int | None:
        """The stored object's size in bytes, or None when there is none (one metadata request)."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` (a folder path, no trailing slash needed), sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; missing objects are not an error."""

    def list_folders(self, prefix: str) -> builtins.list[str]:  # ``list`` is the method above here
        """Immediate child folder names under ``prefix``."""
        base = prefix.rstrip("/") + "/" if prefix else ""
        names = {key[len(base) :].split("/", 1)[0] for key in self.list(prefix) if "/" in key[len(base) :]}
        return sorted(names)


def open_storage(
    url: str, config: StorageConfig | None = None, s3_clients: Callable[[StorageConfig], Any] | None = None
) -> Storage:
    """The backend for a location URL; no I/O, and no S3 client until the first request.

    ``s3_clients`` hands an ``s3://`` location its boto3 client (a shared one, made ahead); without
    it the location makes its own on its first request.
    """
    parsed = urlparse(url)
    if parsed.scheme == "file":
        from gym_services.control.storage.file import FileStorage

        if parsed.netloc not in ("", "localhost"):
            raise StorageError(f"file:// locations must be local paths, got {url!r}")
        if not parsed.path.startswith("/"):
            raise StorageError(f"file:// location needs an absolute path, got {url!r}")
        return FileStorage(parsed.path)
    if parsed.scheme == "s3":
        from gym_services.control.storage.s3 import S3Storage

        if not parsed.netloc:
            raise StorageError(f"s3:// location needs a bucket, got {url!r}")
        return S3Storage(parsed.netloc, parsed.path.strip("/"), config or StorageConfig(), s3_clients)
    raise StorageError(f"unsupported storage location {url!r}: use s3://bucket/prefix or file:///path")
