"""In-memory storage: a real :class:`~gym_services.control.storage.base.Storage` over a dict, for tests.

Same contract as the ``file://`` and ``s3://`` backends (the storage suite runs against all three): keys are
checked the same way, a put replaces an object whole, a conditional put never overwrites, a listing is sorted and
covers the folder ``prefix`` names. Thread-safe (a lock around the dict), as the store's callers use it from a
pool. Nothing survives the process; a checkpoint location is never opened as memory by URL
(:func:`~gym_services.control.storage.locations.open_storage` knows only ``file://`` and ``s3://``).
"""

from __future__ import annotations

import itertools
import threading

from gym_services.control.storage.base import AlreadyExists, NotFound, Storage, check_key

_numbers = itertools.count(1)


class MemoryStorage(Storage):
    """Objects kept in this process: ``memory://<name>`` (the name only tells locations apart in messages)."""

    def __init__(self, name: str | None = None) -> None:
        self.url = f"memory://{name or f'location-{next(_numbers)}'}"
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        with self._lock:
            self._objects[key] = bytes(data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        check_key(key)
        with self._lock:
            if key in self._objects:
                raise AlreadyExists(f"{self.url}/{key} already exists")
            self._objects[key] = bytes(data)

    def get(self, key: str) -> bytes:
        check_key(key)
        with self._lock:
            data = self._objects.get(key)
        if data is None:
            raise NotFound(f"{self.url}/{key} does not exist")
        return data

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        check_key(key)
        with self._lock:
            data = self._objects.get(key)
        return None if data is None else len(data)

    def list(self, prefix: str = "") -> list[str]:
        folder = check_key(prefix.strip("/")) + "/" if prefix.strip("/") else ""
        with self._lock:
            return sorted(key for key in self._objects if key.startswith(folder))

    def delete(self, key: str) -> None:
        check_key(key)
        with self._lock:
            self._objects.pop(key, None)
