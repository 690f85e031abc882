"""Storage through a gateway: a participant reads and writes its own objects of one transaction without ever holding
the storage location's keys (``docs/decisions.md``, "Participants reach storage through presigned requests").

Who does what:

- The coordinator's side (on Kubernetes, the operator: it alone holds the location's keys) issues a :class:`Grant`
  per participant and transaction with :class:`GrantIssuer`: which checkpoint, which participant, which restore,
  where (:class:`Target`: bucket, prefix, endpoint, the Secret of the keys), until when. The grant travels as an
  HMAC-signed token (:class:`GrantSigner`) in the capture or restore request
  (:class:`~gym_services.control.models.StorageGrant`).
- The participant opens a :class:`GatewayStorage` for it (:mod:`gym_services.control.storage_clients`): every
  object it touches, it first asks the gateway (its server config's ``storage.gateway_url``, never a URL a request
  names) to sign, sending the token, what it wants to do (:class:`Access`) and the key; then it sends the signed
  request to the object store itself. Packs travel straight from the participant to the store: the gateway only
  signs (a few hundred bytes per object).
- The gateway (:func:`sign`) checks the token's signature and expiry and that the key is one this grant covers
  (:meth:`Grant.target_for`, over :func:`gym_services.control.layout.parse_key`), then presigns the one request
  (SigV4, :data:`SIGNED_FOR_S`; a conditional put signs its ``If-None-Match`` header, so the URL cannot overwrite).

What a grant covers:

- a capture's (:attr:`GrantKind.CHECKPOINT`): put its own packs, reuse intent and participant manifest; check the
  size of its own packs (of any checkpoint: reused ones) and whether any checkpoint is published (reuse). No read,
  no list, no delete, nothing of another participant.
- a restore's (:attr:`GrantKind.RESTORE`): read its own participant manifest of that checkpoint and its own packs
  and records (of any checkpoint: a manifest may reference earlier packs); read and conditionally write that one
  restore's decision object, at :attr:`Grant.decisions` when the checkpoint's location is read-only.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from gym_services.base.config import StorageConfig
from gym_services.control import layout
from gym_services.control.layout import KeyKind
from gym_services.control.models import StorageGrant
from gym_services.control.protocol import CHECKPOINT_IN_FLIGHT_S
from gym_services.control.storage.base import AlreadyExists, NotFound, Storage, StorageError, check_key

if TYPE_CHECKING:  # imported where a participant first reaches the gateway: the CLI's checkpoint path loads no httpx
    import httpx

#: how long a presigned request stays valid (one object's upload or download)
SIGNED_FOR_S = 300
#: the gateway's route
SIGN_PATH = "/storage/v1/sign"
#: tries of one signing call or one signed request that got no answer or a 5xx
TRIES = 3
GRANT_VERSION = 1


class Access(enum.StrEnum):
    GET = "get"
    HEAD = "head"
    PUT = "put"
    PUT_IF_ABSENT = "put_if_absent"


class GrantKind(enum.StrEnum):
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"


class GrantRefused(Exception):
    """The gateway does not sign: a token forged, expired or damaged, or a key the grant does not cover."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(_Wire):
    """Where a grant's objects are, and which keys sign for them (the gateway reads the Secret, never a server)."""

    url: str = Field(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?$", description="s3://bucket/prefix")
    endpoint: str | None = Field(default=None, description="S3 endpoint; the gateway's default otherwise")
    region: str | None = None
    credential: str | None = Field(default=None, description="the Secret holding the keys; the gateway's own if None")

    @property
    def bucket(self) -> str:
        return urlparse(self.url).netloc

    @property
    def prefix(self) -> str:
        return urlparse(self.url).path.strip("/")

    def object_key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key


class Grant(_Wire):
    """What one participant may do in one transaction (the module docstring)."""

    version: int = GRANT_VERSION
    kind: GrantKind
    target: Target
    decisions: Target | None = Field(default=None, description="where a restore's decision is, if not at target")
    checkpoint_id: str = Field(min_length=1)
    participant_id: str = Field(min_length=1)
    restore_id: str | None = None
    expires_at: float

    def target_for(self, access: Access, key: str) -> Target:
        """Where ``key`` is when this grant covers ``access`` to it; :class:`GrantRefused` otherwise."""
        parsed = layout.parse_key(key)
        if parsed is None:
            raise GrantRefused(f"{key!r} is not a checkpoint object")
        own = parsed.participant_id == self.participant_id
        this = parsed.checkpoint_id == self.checkpoint_id
        if self.kind is GrantKind.CHECKPOINT:
            writes = {KeyKind.PACK, KeyKind.REUSE_INTENT, KeyKind.PARTICIPANT_MANIFEST}
            if access in (Access.PUT, Access.PUT_IF_ABSENT) and own and this and parsed.kind in writes:
                return self.target
            if access is Access.HEAD and (
                parsed.kind is KeyKind.GLOBAL_MANIFEST
                or (own and parsed.kind is KeyKind.PACK)
                or (own and this and parsed.kind is KeyKind.PARTICIPANT_MANIFEST)
            ):
                return self.target
        else:
            decision = parsed.kind is KeyKind.RESTORE_DECISION and this and parsed.restore_id == self.restore_id
            if decision and access in (Access.GET, Access.PUT_IF_ABSENT):
                return self.decisions or self.target
            if (
                access is Access.GET
                and own
                and (
                    parsed.kind is KeyKind.PACK
                    or (this and parsed.kind in (KeyKind.PARTICIPANT_MANIFEST, KeyKind.V1_RECORD))
                )
            ):
                return self.target
        raise GrantRefused(
            f"the {self.kind} grant of participant {self.participant_id} for checkpoint {self.checkpoint_id} "
            f"does not cover {access} of {key}"
        )


class SignRequest(_Wire):
    """``POST /storage/v1/sign``: sign one request for the token's participant."""

    token: str = Field(min_length=16, max_length=8192)
    access: Access
    key: str = Field(min_length=1, max_length=1024)


class SignedRequest(_Wire):
    """The gateway's answer: send exactly this (method, URL, headers), within ``expires_in_s``."""

    method: str
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    expires_in_s: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class GrantSigner:
    """Tokens of grants: the grant's JSON and its HMAC-SHA256 under a key only the gateway's side holds."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("the storage gateway's signing key needs at least 16 bytes")
        self._key = key

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def issue(self, grant: Grant) -> StorageGrant:
        payload = _b64(grant.model_dump_json(exclude_none=True).encode())
        return StorageGrant(token=SecretStr(f"{payload}.{self._mac(payload)}"))

    def verify(self, token: str, now: float | None = None) -> Grant:
        payload, dot, mac = token.partition(".")
        if not dot or not hmac.compare_digest(mac, self._mac(payload)):
            raise GrantRefused("the grant's signature does not match: not issued by this gateway's operator")
        try:
            grant = Grant.model_validate(json.loads(_unb64(payload)))
        except (ValueError, ValidationError) as exc:
            raise GrantRefused(f"the grant cannot be read: {exc}") from None
        if grant.version != GRANT_VERSION:
            raise GrantRefused(f"grant version {grant.version} is not {GRANT_VERSION}")
        if (time.time() if now is None else now) > grant.expires_at:
            raise GrantRefused(f"the grant of participant {grant.participant_id} has expired")
        return grant


class GrantIssuer:
    """The coordinator's side: one grant per participant and transaction, for the location ``target`` (and
    ``decisions``, where a restore's decision goes when ``target`` is read-only)."""

    def __init__(
        self,
        signer: GrantSigner,
        target: Target,
        decisions: Target | None = None,
        valid_s: float = CHECKPOINT_IN_FLIGHT_S,
    ) -> None:
        self.signer, self.target, self.decisions, self.valid_s = signer, target, decisions, valid_s

    def capture(self, checkpoint_id: str, participant_id: str) -> StorageGrant:
        return self._issue(GrantKind.CHECKPOINT, checkpoint_id, participant_id, None)

    def restore(self, checkpoint_id: str, participant_id: str, restore_id: str) -> StorageGrant:
        return self._issue(GrantKind.RESTORE, checkpoint_id, participant_id, restore_id)

    def _issue(self, kind: GrantKind, checkpoint_id: str, participant_id: str, restore_id: str | None) -> StorageGrant:
        grant = Grant(
            kind=kind,
            target=self.target,
            decisions=self.decisions if kind is GrantKind.RESTORE else None,
            checkpoint_id=checkpoint_id,
            participant_id=participant_id,
            restore_id=restore_id,
            expires_at=time.time() + self.valid_s,
        )
        return self.signer.issue(grant)


# --- the gateway's side: presigning ------------------------------------------------------------------------------

_OPERATIONS = {
    Access.GET: ("get_object", "GET"),
    Access.HEAD: ("head_object", "HEAD"),
    Access.PUT: ("put_object", "PUT"),
    Access.PUT_IF_ABSENT: ("put_object", "PUT"),
}


def presign(client: Any, target: Target, access: Access, key: str, expires_in_s: int = SIGNED_FOR_S) -> SignedRequest:
    """One request presigned with a boto3 S3 client (SigV4: the conditional put's header is signed too)."""
    operation, method = _OPERATIONS[access]
    params: dict[str, Any] = {"Bucket": target.bucket, "Key": target.object_key(key)}
    headers: dict[str, str] = {}
    if access is Access.PUT_IF_ABSENT:
        params["IfNoneMatch"] = "*"
        headers["If-None-Match"] = "*"
    url = client.generate_presigned_url(operation, Params=params, ExpiresIn=expires_in_s, HttpMethod=method)
    return SignedRequest(method=method, url=url, headers=headers, expires_in_s=expires_in_s)


def sign(
    request: SignRequest, signer: GrantSigner, client_for: Callable[[Target], Any], now: float | None = None
) -> SignedRequest:
    """The gateway's answer to one signing request: :class:`GrantRefused` unless the token is good and covers it.
    ``client_for`` gives the boto3 client holding the keys of a target (the gateway's own reading of its Secret)."""
    grant = signer.verify(request.token, now)
    target = grant.target_for(request.access, request.key)
    return presign(client_for(target), target, request.access, request.key)


# --- the participant's side --------------------------------------------------------------------------------------


class GatewayStorage(Storage):
    """A location a participant reaches through the storage gateway with one grant: each object signed by the
    gateway, then sent to or read from the store directly. Only the calls a grant can cover exist: it never lists
    or deletes (a participant never does)."""

    def __init__(self, url: str, gateway_url: str, grant: StorageGrant, http: httpx.Client) -> None:
        self.url = url
        self._sign_url = gateway_url.rstrip("/") + SIGN_PATH
        self._token = grant.token.get_secret_value()
        self._http = http

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request, tried again (a little later) when it got no answer or a 5xx."""
        import httpx

        failure = ""
        for tried in range(TRIES):
            if tried:
                time.sleep(0.2 * 2**tried)
            try:
                answer = self._http.request(method, url, **kwargs)
            except httpx.HTTPError as exc:
                failure = f"{type(exc).__name__}: {exc}"
                continue
            if answer.status_code < 500:
                return answer
            failure = f"{answer.status_code} {answer.text[:200]}"
        raise StorageError(f"{method} {url.split('?', 1)[0]} failed {TRIES} times: {failure}")

    def _signed(self, access: Access, key: str) -> SignedRequest:
        check_key(key)
        body = {"token": self._token, "access": access.value, "key": key}
        answer = self._send("POST", self._sign_url, json=body)
        if answer.status_code != 200:
            try:
                detail = answer.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                detail = answer.text[:300]
            raise StorageError(f"the storage gateway did not sign {access} of {self.url}/{key}: {detail}")
        try:
            return SignedRequest.model_validate(answer.json())
        except (ValueError, ValidationError) as exc:
            raise StorageError(f"the storage gateway's answer for {self.url}/{key} is malformed: {exc}") from None

    def _do(self, access: Access, key: str, content: bytes | None = None) -> httpx.Response:
        signed = self._signed(access, key)
        return self._send(signed.method, signed.url, headers=signed.headers, content=content)

    def _fail(self, access: Access, key: str, answer: httpx.Response) -> StorageError:
        return StorageError(f"{access} {self.url}/{key} failed: {answer.status_code} {answer.text[:300]}")

    def put(self, key: str, data: bytes) -> None:
        answer = self._do(Access.PUT, key, data)
        if answer.status_code not in (200, 201, 204):
            raise self._fail(Access.PUT, key, answer)

    def put_if_absent(self, key: str, data: bytes) -> None:
        answer = self._do(Access.PUT_IF_ABSENT, key, data)
        if answer.status_code in (409, 412):
            raise AlreadyExists(f"{self.url}/{key} already exists")
        if answer.status_code not in (200, 201, 204):
            raise self._fail(Access.PUT_IF_ABSENT, key, answer)

    def get(self, key: str) -> bytes:
        answer = self._do(Access.GET, key)
        if answer.status_code == 404:
            raise NotFound(f"{self.url}/{key} does not exist")
        if answer.status_code != 200:
            raise self._fail(Access.GET, key, answer)
        return answer.content

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        answer = self._do(Access.HEAD, key)
        if answer.status_code == 404:
            return None
        if answer.status_code != 200:
            raise self._fail(Access.HEAD, key, answer)
        return int(answer.headers.get("content-length", 0))

    def list(self, prefix: str = "") -> list[str]:
        raise StorageError(f"{self.url}: a participant does not list through the storage gateway")

    def delete(self, key: str) -> None:
        raise StorageError(f"{self.url}: a participant does not delete through the storage gateway")


class GatewayHttp:
    """The one HTTP client of a server's gateway locations (its connections shared by every upload thread)."""

    def __init__(self, max_connections: int) -> None:
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self.max_connections = max_connections

    @property
    def client(self) -> httpx.Client:
        import httpx

        with self._lock:
            if self._client is None:
                limits = httpx.Limits(
                    max_connections=self.max_connections, max_keepalive_connections=self.max_connections
                )
                self._client = httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0), limits=limits)
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def storage_config_of(target: Target, keys: dict[str, str] | None, default: StorageConfig) -> StorageConfig:
    """The boto3 settings the gateway signs a target's requests with: its endpoint and region (else the gateway's
    defaults) and the keys read from its Secret (else the gateway's own identity)."""
    fields: dict[str, Any] = {
        **default.model_dump(),
        "endpoint_url": target.endpoint or default.endpoint_url,
        "region": target.region or default.region,
    }
    if keys:
        fields |= {"access_key_id": keys["AWS_ACCESS_KEY_ID"], "secret_access_key": keys["AWS_SECRET_ACCESS_KEY"]}
    return StorageConfig.model_validate(fields)
