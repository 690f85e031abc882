"""The storage interface every backend implements, and its errors.

Keys are ``/``-separated paths relative to the location's prefix. Methods are
synchronous (boto3 is); async callers run them in threads. The backends (:mod:`.file`, :mod:`.s3`,
:mod:`.memory`) import this module; :mod:`.locations` opens one by its URL.
"""

from __future__ import annotations

import abc
import builtins
import re

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

    def probe(self) -> None:
        """One cheap request that fails (:class:`StorageError`) when the location cannot be reached or read: how a
        storage location's validation checks it (the operator's). The default lists ``checkpoints/``."""
        self.list("checkpoints")

    def list_folders(self, prefix: str) -> builtins.list[str]:  # ``list`` is the method above here
        """Immediate child folder names under ``prefix``."""
        base = prefix.rstrip("/") + "/" if prefix else ""
        names = {key[len(base) :].split("/", 1)[0] for key in self.list(prefix) if "/" in key[len(base) :]}
        return sorted(names)
