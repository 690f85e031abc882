"""The httpx client an agent uses for its model, resources and environment servers.

It never keeps cookies itself: every episode owns its cookies per downstream server
(they are part of the boundary and travel with a checkpoint), so each call sends the
episode's cookies explicitly and returns the server's ``Set-Cookie`` values merged in.
Identity headers go on every call, so every server can fence stale attempts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http.cookiejar import Cookie, CookieJar, CookiePolicy
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.request import Request

import httpx
import pydantic_core

from gym_services.base.affinity import expand_endpoints, replica_for
from gym_services.base.errors import ApiError, ErrorCode
from gym_services.base.identity import FIRST_SESSION_HEADER, RolloutIdentity


class CheckpointParked(Exception):
    """A downstream server refused the call because a checkpoint is open; nothing changed there."""

    def __init__(self, server: str, path: str, message: str) -> None:
        super().__init__(f"{server} {path}: {message}")
        self.server = server
        self.path = path


class DownstreamUnavailable(Exception):
    """A downstream server could not be reached, or answered ``503`` before doing anything
    (``upstream_unavailable``: the policy model's worker stayed down; ``not_ready``): the step did not
    happen there, so the episode goes back to the boundary before it and tries again later."""

    def __init__(self, server: str, path: str, reason: str, detail: str) -> None:
        super().__init__(f"{server} {path}: {reason}: {detail}")
        self.server = server
        self.path = path
        #: ``unreachable``, or the ``503`` code the server answered
        self.reason = reason
        self.detail = detail


class DownstreamBrokeOff(DownstreamUnavailable):
    """The connection broke after the call was sent and before its answer came (reset, closed without an
    answer, timed out): the server died mid-call, or the network dropped the call. Unlike an unreachable
    server, this one may have done the step. A replay step (seed, generation, ``replay`` verification) is tried
    again from its boundary as for an unreachable server; a waited step (a tool call, an environment step) is
    not, since it would run twice: the episode ends as an infrastructure failure (``503 upstream_unavailable``),
    which the collection runs again as attempt + 1, fencing what this attempt left on every server."""


#: a call that never reached the server
UNREACHABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: a call the connection dropped after it was sent (checked after :data:`UNREACHABLE`, whose errors are among these)
BROKEN_OFF = (httpx.NetworkError, httpx.RemoteProtocolError, httpx.TimeoutException)
#: ``503`` codes that say "not now": the server did nothing with the call
UNAVAILABLE_CODES = frozenset({ErrorCode.UPSTREAM_UNAVAILABLE, ErrorCode.NOT_READY})
#: gateway statuses a proxy or load balancer between the agent and a Gym server answers by itself (an answer
#: without a Gym error body): ``503`` it had no server to send the call to (a Service without ready endpoints),
#: so nothing happened; ``502``/``504`` it lost the server's answer, which may have happened, as for a broken call
GATEWAY_STATUSES = frozenset({502, 503, 504})


class _NoCookies(CookiePolicy):
    """A cookie policy that stores and sends nothing (cookies are per episode, not per client)."""

    netscape = True
    rfc2965 = False
    hide_cookie2 = True

    def set_ok(self, cookie: Cookie, request: Request) -> bool:
        return False

    def return_ok(self, cookie: Cookie, request: Request) -> bool:
        return False

    def domain_return_ok(self, domain: str, request: Request) -> bool:
        return False

    def path_return_ok(self, path: str, request: Request) -> bool:
        return False


def cookieless_client(
    *, transport: httpx.AsyncBaseTransport, timeout_s: float = 600.0, base_url: str = ""
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=transport,
        base_url=base_url,
        timeout=timeout_s,
        cookies=CookieJar(policy=_NoCookies()),
        trust_env=False,
    )


def cookie_header(cookies: dict[str, str]) -> str:
    return "; ".join(f"{name}={value}" for name, value in sorted(cookies.items()))


def merge_set_cookies(cookies: dict[str, str], response: httpx.Response) -> dict[str, str]:
    """``cookies`` updated with every ``Set-Cookie`` of ``response``."""
    merged = dict(cookies)
    for raw in response.headers.get_list("set-cookie"):
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw)
        except CookieError:
            continue
        for name, morsel in jar.items():
            merged[name] = morsel.value
    return merged


def json_bytes(value: Any) -> bytes:
    """A body as JSON: token arrays (:mod:`gym_services.base.token_arrays`) as the lists they stand for, non-finite
    floats as the standard library writes them."""
    return pydantic_core.to_json(value, inf_nan_mode="constants")


@dataclass
class Reply:
    """A successful downstream reply."""

    status: int
    body: Any
    headers: httpx.Headers
    cookies: dict[str, str] = field(default_factory=dict)
    text: str = ""
    content: bytes = b""


def error_of(response: httpx.Response) -> tuple[str | None, str]:
    """The ``error.code`` and message of a JSON error body, if it has one."""
    try:
        data = response.json()
    except ValueError:
        return None, response.text[:500]
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        return err.get("code"), str(err.get("message", ""))
    return None, response.text[:500]


class Downstream:
    """One downstream server, addressed by name (``model``, ``resources``, ``env``) and base URL.

    A replicated server has one base URL per replica, in ordinal order; every call of a rollout goes
    to the replica :func:`~gym_services.base.affinity.replica_for` picks for its rollout id, the one
    that holds its session (a call without identity goes to the first)."""

    def __init__(self, name: str, base_url: str | list[str], client: httpx.AsyncClient) -> None:
        self.name = name
        self.base_urls = expand_endpoints(base_url)
        self.client = client

    @property
    def base_url(self) -> str:
        return self.base_urls[0]

    def url_for(self, identity: RolloutIdentity | None) -> str:
        """The base URL of the replica holding ``identity``'s rollout."""
        if identity is None or len(self.base_urls) == 1:
            return self.base_urls[0]
        return self.base_urls[replica_for(identity.rollout_id, len(self.base_urls))]

    async def send(
        self,
        path: str,
        body: Any,
        *,
        identity: RolloutIdentity | None,
        cookies: dict[str, str],
        extra_headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """POST ``body`` (a JSON value, or the bytes of one, sent as they are) and return the raw response; only
        transport failures raise: :class:`DownstreamUnavailable` when the call never reached the server,
        :class:`DownstreamBrokeOff` when the connection broke before the answer came, else (a bad URL, an answer it
        cannot decode) ``502 upstream_error``."""
        headers = dict(extra_headers or {})
        if identity is not None:
            headers.update(identity.headers())
        if cookies:
            headers["cookie"] = cookie_header(cookies)
        elif identity is not None:  # lets a seed drop what an earlier attempt's seed left unreachable
            headers[FIRST_SESSION_HEADER] = "1"
        headers["content-type"] = "application/json"
        try:
            content = body if isinstance(body, bytes) else json_bytes(body)
            return await self.client.post(f"{self.url_for(identity)}{path}", content=content, headers=headers)
        except UNREACHABLE as exc:
            raise DownstreamUnavailable(self.name, path, "unreachable", f"{type(exc).__name__}: {exc}") from None
        except BROKEN_OFF as exc:
            raise DownstreamBrokeOff(self.name, path, "broke_off", f"{type(exc).__name__}: {exc}") from None
        except httpx.HTTPError as exc:
            raise ApiError(
                ErrorCode.UPSTREAM_ERROR, f"{self.name} {path} unreachable: {type(exc).__name__}: {exc}"
            ) from None

    async def post(
        self,
        path: str,
        body: Any,
        *,
        identity: RolloutIdentity | None,
        cookies: dict[str, str],
        accept_client_errors: bool = False,
        accept_errors: bool = False,
    ) -> Reply:
        """POST and classify the answer.

        ``409 checkpoint_parked`` raises :class:`CheckpointParked` (the caller returns to
        its boundary); ``409 stale_attempt`` ends the attempt; an unreachable server, a
        ``503`` that did nothing, or a proxy's own ``503`` raises :class:`DownstreamUnavailable`
        (the caller returns to its boundary and retries later), a connection broken mid-call or a
        proxy's own ``502``/``504`` :class:`DownstreamBrokeOff` (retried only when the step is a
        replay step); other errors are a 502, except 4xx when
        ``accept_client_errors``, and any other status when ``accept_errors`` (a tool's
        answer, whatever its status, is the tool's output).
        """
        response = await self.send(path, body, identity=identity, cookies=cookies)
        merged = merge_set_cookies(cookies, response)
        if response.status_code == 409:
            code, message = error_of(response)
            if code == ErrorCode.CHECKPOINT_PARKED:
                raise CheckpointParked(self.name, path, message)
            if code == ErrorCode.STALE_ATTEMPT:
                raise ApiError(ErrorCode.STALE_ATTEMPT, f"{self.name} {path}: {message}")
        if response.status_code in GATEWAY_STATUSES:
            code, message = error_of(response)
            if response.status_code == 503 and code in UNAVAILABLE_CODES:
                raise DownstreamUnavailable(self.name, path, str(code), message)
            if code is None:  # not a Gym server's answer: the proxy in between answered
                reason, detail = f"gateway_{response.status_code}", message[:200]
                if response.status_code == 503:
                    raise DownstreamUnavailable(self.name, path, reason, detail)
                raise DownstreamBrokeOff(self.name, path, reason, detail)
        ok = 200 <= response.status_code < 300
        if not ok and not accept_errors and not (accept_client_errors and 400 <= response.status_code < 500):
            code, message = error_of(response)
            raise ApiError(
                ErrorCode.UPSTREAM_ERROR,
                f"{self.name} {path} answered {response.status_code}: {code or ''} {message}".strip(),
                details={"server": self.name, "path": path, "status": response.status_code, "code": code},
            )
        try:
            parsed = response.json()
        except (ValueError, json.JSONDecodeError):
            parsed = None
        return Reply(response.status_code, parsed, response.headers, merged, response.text, response.content)
