"""What tests need from kemu beyond the API: an audit of every request, injected faults and outages.

Served under `/kemu/v1/` to the admin only (a ServiceAccount gets 403, as for any path its Roles do not
grant), so a test can drive faults while the code under test runs with its own identity:

- `GET /kemu/v1/audit?user=NAME`: every request so far (of that user): verb, apiGroup, resource, subresource,
  namespace, name, code
- `POST /kemu/v1/faults` `{"verb", "resource", "subresource", "name", "user", "code", "times"}`: the next `times`
  matching requests are answered `code` (409 `Conflict`, 429 `TooManyRequests` with `Retry-After`, 500
  `InternalError`, 503 `ServiceUnavailable`, 504 `Timeout`) with kube-apiserver's `Status` body; empty fields match
  anything
- `POST /kemu/v1/outage` `{"seconds": S}`: the server stops listening and drops every connection (clients get
  connection refused or reset), and comes back on the same port after `S` seconds with every object as it was
- `DELETE /kemu/v1/faults`: forget the rules not used up
- `POST /kemu/v1/compact`: etcd compaction: the watch history so far is gone, so a watch resuming from an older
  resourceVersion gets the watch cache's answer, a streamed `ERROR` event with a 410 `Expired` Status
- `POST /kemu/v1/stall` `{"seconds": S, "resource", "user"}`: every watch stream open now (of that resource plural
  and user; empty matches any) goes silent, as over a half-open connection: no event, no end, for `S` seconds; then
  its connection is dropped. Watches opened later are served normally

Like the rest of kemu, this is a test double's control surface; a real API server has none of it.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp.web

from .auth import Attributes
from .errors import KemuError

PREFIX = "/kemu/v1/"
AUDIT_LIMIT = 200_000

_FAULTS: dict[int, tuple[str, str]] = {
    409: (
        "Conflict",
        "Operation cannot be fulfilled: the object has been modified; please apply your changes to the "
        "latest version and try again",
    ),
    429: ("TooManyRequests", "the server has received too many requests and has asked us to try again later"),
    500: ("InternalError", 'an error on the server ("injected by kemu") has prevented the request from succeeding'),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: (
        "Timeout",
        "the server was unable to return a response in the time allotted, but may still be processing the request",
    ),
}


@dataclass
class Entry:
    """One audited request."""

    time: float
    user: str
    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    path: str
    #: the answer's status; 0 while it is being served (a watch is audited when it starts, not when it ends)
    code: int


@dataclass
class Rule:
    """Answer the next `times` requests matching every non-empty field with `code`."""

    code: int
    times: int = 1
    verb: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    user: str = ""
    served: int = field(default=0)

    def matches(self, attributes: Attributes) -> bool:
        return self.served < self.times and all(
            (
                not self.verb or self.verb == attributes.verb,
                not self.resource or self.resource == attributes.resource,
                not self.subresource or self.subresource == attributes.subresource,
                not self.name or self.name == attributes.name,
                not self.user or self.user == attributes.user.name,
            )
        )


class Harness:
    """The audit log, fault rules and outage switch of one kemu process."""

    def __init__(self) -> None:
        self.audit: collections.deque[Entry] = collections.deque(maxlen=AUDIT_LIMIT)
        self.rules: list[Rule] = []
        #: set by the process that owns the listener: `outage(seconds)` starts one (and returns at once)
        self.outage: Callable[[float], Any] | None = None
        #: set by the emulator: `compact()` drops the watch history (returns the revision compacted to)
        self.compact: Callable[[], int] | None = None
        #: set by the emulator: wakes every watch stream (so one told to stall sees it at once)
        self.pulse: Callable[[], None] | None = None
        #: stall requests: (when requested, until, resource plural or "", user or "")
        self.stalls: list[tuple[float, float, str, str]] = []

    def stall_of(self, resource: str, user: str, opened: float) -> float | None:
        """When the stall of a watch stream (of `resource`, by `user`, opened at `opened`) ends, if it is stalled."""
        now = time.monotonic()
        self.stalls = [stall for stall in self.stalls if stall[1] > now]
        for requested, until, plural, who in self.stalls:
            if opened <= requested and plural in ("", resource) and who in ("", user):
                return until
        return None

    def record(self, attributes: Attributes, code: int) -> Entry:
        entry = Entry(
            time.time(),
            attributes.user.name,
            attributes.verb,
            attributes.api_group,
            attributes.resource,
            attributes.subresource,
            attributes.namespace,
            attributes.name,
            attributes.path,
            code,
        )
        self.audit.append(entry)
        return entry

    def fault(self, attributes: Attributes) -> KemuError | None:
        """The injected answer for this request, if a rule takes it."""
        for rule in self.rules:
            if rule.matches(attributes):
                rule.served += 1
                reason, message = _FAULTS[rule.code]
                details: dict[str, Any] = {
                    "name": attributes.name,
                    "group": attributes.api_group,
                    "kind": attributes.resource,
                }
                if rule.code == 429:
                    details["retryAfterSeconds"] = 1
                return KemuError(rule.code, reason, message, details)
        return None

    async def serve(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        route = raw.path[len(PREFIX) :]
        if route == "audit" and raw.method == "GET":
            user = raw.query.get("user")
            items = [asdict(e) for e in self.audit if user is None or e.user == user]
            return aiohttp.web.json_response({"items": items})
        if route == "faults" and raw.method == "GET":
            return aiohttp.web.json_response({"items": [asdict(r) for r in self.rules]})
        if route == "faults" and raw.method == "DELETE":
            self.rules.clear()
            return aiohttp.web.json_response({"items": []})
        if route == "faults" and raw.method == "POST":
            body = await raw.json()
            code = int(body.get("code", 0))
            if code not in _FAULTS:
                return KemuError(400, "BadRequest", f"code must be one of {sorted(_FAULTS)}").response()
            known = {"verb", "resource", "subresource", "name", "user", "times"}
            rule = Rule(code=code, **{k: v for k, v in body.items() if k in known})
            self.rules.append(rule)
            return aiohttp.web.json_response(asdict(rule), status=201)
        if route == "compact" and raw.method == "POST" and self.compact is not None:
            return aiohttp.web.json_response({"resourceVersion": str(self.compact())})
        if route == "stall" and raw.method == "POST":
            body = await raw.json()
            seconds = float(body.get("seconds", 0))
            if not 0 < seconds <= 600:
                return KemuError(400, "BadRequest", "a stall needs 0 < seconds <= 600").response()
            now = time.monotonic()
            stall = (now, now + seconds, str(body.get("resource") or ""), str(body.get("user") or ""))
            self.stalls.append(stall)
            if self.pulse is not None:
                self.pulse()
            return aiohttp.web.json_response({"seconds": seconds, "resource": stall[2], "user": stall[3]}, status=201)
        if route == "outage" and raw.method == "POST":
            seconds = float((await raw.json()).get("seconds", 0))
            if self.outage is None or not 0 < seconds <= 60:
                return KemuError(400, "BadRequest", "an outage needs 0 < seconds <= 60 and a listener").response()
            response = aiohttp.web.json_response({"seconds": seconds}, status=202)
            await response.prepare(raw)
            await response.write_eof()
            self.outage(seconds)
            return response
        return KemuError(404, "NotFound", f"no harness route {raw.method} {raw.path}").response()
