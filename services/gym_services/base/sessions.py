"""Signed session cookies: the resources servers key their sessions by this id (``docs/protocol.md``, "Identity and
fencing").

The signing secret comes from the deployment, never from names, so a fresh process
started with the same secret accepts a restored session's cookie. Each server signs
with its own salt and uses its own cookie name, so one cookie jar can hold the cookies
of every server an episode talks to.

A cookie also carries, signed, the rollout and attempt of the call that made the session (its identity headers;
none when it carried none), signed again when a newer attempt of that rollout is admitted with it. The session then
knows its attempt whatever a later call sends: admission fences a call that carries no identity headers by the attempt
its cookie carries (:mod:`gym_services.control.admission`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from http.cookies import SimpleCookie

from itsdangerous import BadSignature, URLSafeSerializer
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_services.base.errors import ApiError
from gym_services.base.identity import ROLLOUT_ID_PATTERN, RolloutIdentity

SESSION_SCOPE_KEY = "gym_session_id"
#: the scope key of the session's signed identity (a :class:`RolloutIdentity`, or None for a session made without)
SESSION_IDENTITY_KEY = "gym_session_identity"


def cookie_name(server_name: str) -> str:
    return f"gym_session_{server_name}"


@dataclass(frozen=True)
class SignedSession:
    """What a session cookie says: the session id, and the identity of the newest attempt admitted with it."""

    session_id: str
    identity: RolloutIdentity | None = None


class SessionCodec:
    """Signs and reads session cookies for one server."""

    def __init__(self, secret: str, server_name: str) -> None:
        self.name = cookie_name(server_name)
        self._serializer = URLSafeSerializer(secret, salt=f"gym-checkpoint-session:{server_name}")

    def sign(self, session_id: str, identity: RolloutIdentity | None = None) -> str:
        payload: dict[str, str | int] = {"sid": session_id}
        if identity is not None:
            payload.update(rid=identity.rollout_id, att=identity.attempt)
        return self._serializer.dumps(payload)

    def open(self, value: str) -> SignedSession | None:
        """The session a cookie value names, or None when it is not one this server signed."""
        try:
            data = self._serializer.loads(value)
        except BadSignature:
            return None
        if not isinstance(data, dict):
            return None
        sid = data.get("sid")
        if not isinstance(sid, str) or not sid:
            return None
        return SignedSession(sid, _signed_identity(data))

    def read(self, value: str) -> str | None:
        """The session id of a cookie value, or None when it is not one this server signed."""
        session = self.open(value)
        return None if session is None else session.session_id


def _signed_identity(data: Mapping[str, object]) -> RolloutIdentity | None:
    """The identity a cookie was signed with; None for a session made without one (or signed before cookies
    carried it: nothing fences such a session by its cookie)."""
    rollout_id, attempt = data.get("rid"), data.get("att")
    if not isinstance(rollout_id, str) or not ROLLOUT_ID_PATTERN.match(rollout_id):
        return None
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        return None
    return RolloutIdentity(rollout_id=rollout_id, attempt=attempt)


class SessionMiddleware:
    """Puts the cookie's session (id and signed identity) on the scope, minting and setting a new one when absent.

    A new session is signed with the identity headers of the call that made it (a malformed header signs none:
    admission refuses that call anyway). A call admitted under a newer attempt of the session's rollout (a restored
    episode's) gets the cookie signed again with that attempt (:func:`newer_identity`), so the session's identity is
    the newest attempt that used it: a copy of the cookie an older attempt still holds stays stale."""

    def __init__(self, app: ASGIApp, codec: SessionCodec) -> None:
        self.app = app
        self.codec = codec

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session = None
        for name, value in scope.get("headers", []):
            if name == b"cookie":
                jar: SimpleCookie = SimpleCookie()
                try:
                    jar.load(value.decode("latin-1"))
                except Exception:
                    continue
                if self.codec.name in jar:
                    session = self.codec.open(jar[self.codec.name].value)
        identity = _identity_of(scope)
        is_new = session is None
        if session is None:
            session = SignedSession(uuid.uuid4().hex, identity)
        state = scope.setdefault("state", {})
        state[SESSION_SCOPE_KEY] = session.session_id
        state[SESSION_IDENTITY_KEY] = session.identity
        renewed = None if is_new else newer_identity(session.identity, identity)
        minted = session if renewed is None else SignedSession(session.session_id, renewed)

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start" and (is_new or (renewed and message["status"] < 400)):
                signed = self.codec.sign(minted.session_id, minted.identity)
                cookie = f"{self.codec.name}={signed}; Path=/; HttpOnly; SameSite=Lax"
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"set-cookie", cookie.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def newer_identity(session: RolloutIdentity | None, call: RolloutIdentity | None) -> RolloutIdentity | None:
    """``call``'s identity when it is a newer attempt of the rollout ``session`` was signed with (the cookie is
    signed again with it once the call is admitted); else None."""
    if session is None or call is None or call.rollout_id != session.rollout_id or call.attempt <= session.attempt:
        return None
    return call


def _identity_of(scope: Scope) -> RolloutIdentity | None:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    try:
        return RolloutIdentity.from_headers(headers)
    except ApiError:
        return None


def session_id(request: Request) -> str:
    """The session id of this request (set by :class:`SessionMiddleware`)."""
    return str(request.scope["state"][SESSION_SCOPE_KEY])


def session_identity(scope: Scope) -> RolloutIdentity | None:
    """The identity the request's session was signed with (set by :class:`SessionMiddleware`; None without one)."""
    identity = scope.get("state", {}).get(SESSION_IDENTITY_KEY)
    return identity if isinstance(identity, RolloutIdentity) else None
