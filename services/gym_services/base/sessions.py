"""Signed session cookies: the resources servers key their sessions by this id (``docs/protocol.md``, "Identity and
fencing").

The signing secret comes from the deployment, never from names, so a fresh process
started with the same secret accepts a restored session's cookie. Each server signs
with its own salt and uses its own cookie name, so one cookie jar can hold the cookies
of every server an episode talks to.
"""

from __future__ import annotations

import uuid
from http.cookies import SimpleCookie

from itsdangerous import BadSignature, URLSafeSerializer
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_SCOPE_KEY = "gym_session_id"


def cookie_name(server_name: str) -> str:
    return f"gym_session_{server_name}"


class SessionCodec:
    """Signs and reads session ids for one server."""

    def __init__(self, secret: str, server_name: str) -> None:
        self.name = cookie_name(server_name)
        self._serializer = URLSafeSerializer(secret, salt=f"gym-checkpoint-session:{server_name}")

    def sign(self, session_id: str) -> str:
        return self._serializer.dumps({"sid": session_id})

    def read(self, value: str) -> str | None:
        try:
            data = self._serializer.loads(value)
        except BadSignature:
            return None
        sid = data.get("sid") if isinstance(data, dict) else None
        return sid if isinstance(sid, str) and sid else None


class SessionMiddleware:
    """Puts the cookie's session id on the scope, minting and setting a new one when absent."""

    def __init__(self, app: ASGIApp, codec: SessionCodec) -> None:
        self.app = app
        self.codec = codec

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session_id = None
        for name, value in scope.get("headers", []):
            if name == b"cookie":
                jar: SimpleCookie = SimpleCookie()
                try:
                    jar.load(value.decode("latin-1"))
                except Exception:
                    continue
                if self.codec.name in jar:
                    session_id = self.codec.read(jar[self.codec.name].value)
        is_new = session_id is None
        if session_id is None:
            session_id = uuid.uuid4().hex
        scope.setdefault("state", {})[SESSION_SCOPE_KEY] = session_id

        async def send_with_cookie(message: Message) -> None:
            if is_new and message["type"] == "http.response.start":
                cookie = f"{self.codec.name}={self.codec.sign(session_id)}; Path=/; HttpOnly; SameSite=Lax"
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"set-cookie", cookie.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def session_id(request: Request) -> str:
    """The session id of this request (set by :class:`SessionMiddleware`)."""
    return request.scope["state"][SESSION_SCOPE_KEY]
