"""``s3://`` storage over boto3, for any S3-compatible server.

Endpoint and region come from the server's config or the standard AWS variables
(``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ...). Manifests are
written with ``IfNoneMatch='*'`` so a published checkpoint is never overwritten.

Opening a location makes no boto3 client: the client (importing boto3, loading the S3 service
model, resolving credentials: about a second of CPU the first time) comes on the first request from
:class:`SharedClients` (one per access, for the process: :data:`SHARED`, unless the opener hands in its
own; a server's :mod:`gym_services.control.storage_clients` does, and makes it at start-up), so naming
a location under a checkpoint's pause costs nothing.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gym_services.base.config import StorageConfig
from gym_services.control.storage.base import AlreadyExists, NotFound, Storage, StorageError, check_key

#: the variables a boto3 session reads for S3 (endpoint, region, credentials): a change means another client
ENVIRONMENT = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
)
#: makes (or returns a shared) boto3 S3 client for a storage config
ClientFactory = Callable[[StorageConfig], Any]


def new_client(config: StorageConfig, session: Any = None) -> Any:
    """A boto3 S3 client for ``config``, from ``session`` (a fresh boto3 session otherwise).

    Raises :class:`StorageError` for an endpoint or region botocore refuses.
    """
    import boto3  # here, not at import: a file-only process never pays for it
    from botocore.config import Config

    keys = {}
    if config.access_key_id is not None and config.secret_access_key is not None:
        keys = {
            "aws_access_key_id": config.access_key_id.get_secret_value(),
            "aws_secret_access_key": config.secret_access_key.get_secret_value(),
        }
    try:
        return (session or boto3.session.Session()).client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=config.region,
            **keys,
            config=Config(
                max_pool_connections=max(10, config.max_concurrency),
                retries={"max_attempts": 3, "mode": "standard"},
                s3={"addressing_style": "path"},
                signature_version="s3v4",  # presigned requests too (a signed conditional put cannot overwrite)
            ),
        )
    except (ValueError, BotoCoreError) as exc:  # botocore: invalid endpoint or region, partial credentials
        raise StorageError(f"cannot reach S3 at {config.endpoint_url or 'the default endpoint'}: {exc}") from None


class SharedClients:
    """One boto3 client per access (endpoint, region, keys, and the ``AWS_*`` variables boto3 reads) from one
    boto3 session per set of those variables, so only the first client pays for the service model and a location
    reached again reuses the client's connections. Thread-safe; keeps the ``keep`` most recently made (credentials
    that rotate do not pile up)."""

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._clients: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._sessions: dict[tuple[str | None, ...], Any] = {}  # a session caches the credentials it resolved
        self._lock = threading.Lock()  # boto3 sessions are not safe to make clients from in two threads at once

    def __call__(self, config: StorageConfig) -> Any:
        env = tuple(os.environ.get(name) for name in ENVIRONMENT)
        key = (
            config.endpoint_url,
            config.region,
            config.max_concurrency,
            config.access_key_id.get_secret_value() if config.access_key_id else None,
            config.secret_access_key.get_secret_value() if config.secret_access_key else None,
            env,
        )
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                session = self._sessions.get(env)
                if session is None:
                    import boto3

                    session = self._sessions[env] = boto3.session.Session()
                client = self._clients[key] = new_client(config, session)
                while len(self._clients) > self.keep:
                    self._clients.popitem(last=False)
                live = {k[-1] for k in self._clients}
                self._sessions = {e: s for e, s in self._sessions.items() if e in live}
            self._clients.move_to_end(key)
            return client


#: the process's clients, for locations opened without a factory of their own (the coordinator, the CLI)
SHARED = SharedClients()


class S3Storage(Storage):
    def __init__(self, bucket: str, prefix: str, config: StorageConfig, clients: ClientFactory | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._config = config
        self._clients: ClientFactory = clients or SHARED
        self._made: Any = None
        self._lock = threading.Lock()

    @property
    def _client(self) -> Any:
        """The boto3 client, made (or fetched from the shared factory) on the first request."""
        if self._made is None:
            with self._lock:
                if self._made is None:
                    self._made = self._clients(self._config)
        return self._made

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, action: str, key: str, exc: Exception) -> StorageError:
        return StorageError(f"S3 {action} {self.url}/{key} failed: {exc}")

    def put(self, key: str, data: bytes) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("put", key, exc) from None

    def put_if_absent(self, key: str, data: bytes) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                raise AlreadyExists(f"{self.url}/{key} already exists") from None
            raise self._fail("conditional put", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("conditional put", key, exc) from None

    def get(self, key: str) -> bytes:
        try:
            data: bytes = self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
            return data
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise NotFound(f"{self.url}/{key} does not exist") from None
            raise self._fail("get", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("get", key, exc) from None

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        try:
            return int(self._client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise self._fail("head", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("head", key, exc) from None

    def list(self, prefix: str = "") -> list[str]:
        full = self._key(prefix.strip("/")) + "/" if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("list", prefix, exc) from None
        return sorted(keys)

    def probe(self) -> None:
        """One listing of at most one key under the prefix: the bucket answers, and these keys may read it."""
        try:
            self._client.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else "", MaxKeys=1)
        except (BotoCoreError, ClientError) as exc:
            raise StorageError(f"S3 list {self.url} failed: {exc}") from None

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("delete", key, exc) from None
