"""Opening a checkpoint location by its URL: ``file:///path`` or ``s3://bucket/prefix``.

Above the backends (:mod:`.file`, :mod:`.s3`), which know nothing of URLs: this module picks one. The in-memory
backend (:mod:`.memory`) has no URL; tests build it directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from gym_services.base.config import StorageConfig
from gym_services.control.storage.base import Storage, StorageError
from gym_services.control.storage.file import FileStorage


def open_storage(
    url: str, config: StorageConfig | None = None, s3_clients: Callable[[StorageConfig], Any] | None = None
) -> Storage:
    """The backend for a location URL; no I/O, and no S3 client until the first request.

    ``s3_clients`` hands an ``s3://`` location its boto3 client (a shared one, made ahead); without
    it the location makes its own on its first request.
    """
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(f"file:// locations must be local paths, got {url!r}")
        if not parsed.path.startswith("/"):
            raise StorageError(f"file:// location needs an absolute path, got {url!r}")
        return FileStorage(parsed.path)
    if parsed.scheme == "s3":
        from gym_services.control.storage.s3 import S3Storage  # here: a file-only process never imports botocore

        if not parsed.netloc:
            raise StorageError(f"s3:// location needs a bucket, got {url!r}")
        return S3Storage(parsed.netloc, parsed.path.strip("/"), config or StorageConfig(), s3_clients)
    raise StorageError(f"unsupported storage location {url!r}: use s3://bucket/prefix or file:///path")
