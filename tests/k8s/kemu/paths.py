"""kemu's own reading of a request's path: which resource, namespace, object and subresource it names.

kemu builds every :class:`kmock.Request` itself (``Kemu.__call__``) from the aiohttp request and this
parser, through kmock's public ``Request`` constructor, instead of letting kmock parse it: kmock 0.8 reads
``/api/v1/namespaces`` and ``/api/v1/namespaces/<name>`` as a namespace prefix with no resource (and fails
on the first with HTTP 500), and builds its requests with a parser it offers no hook to replace. Here
``namespaces/<ns>/`` is a prefix only when a resource follows it, and ``namespaces/<name>/status|finalize``
are the Namespace's own subresources (kube-apiserver's RequestInfo reads paths the same way).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import aiohttp.web
import kmock

NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@dataclass(frozen=True)
class ParsedPath:
    """The Kubernetes parts of a path; ``group`` is None for a path outside ``/api`` and ``/apis``."""

    group: str | None = None
    version: str | None = None
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_path(path: str) -> ParsedPath:
    parts = path.strip("/").split("/")
    if len(parts) >= 2 and parts[0] == "apis":
        group, version, rest = parts[1], (parts[2] if len(parts) > 2 else None), parts[3:]
    elif len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    else:
        return ParsedPath()
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest and rest[0] else None
    name = rest[1] if len(rest) > 1 and rest[1] else None
    subresource = "/".join(part for part in rest[2:] if part) or None
    return ParsedPath(group, version, plural, namespace, name, subresource)


def action_of(parsed: ParsedPath, method: str, watch: bool) -> kmock.action | None:
    """The Kubernetes verb kmock's request criteria match on (None outside the API or for other methods)."""
    if parsed.group is None:
        return None
    if method == "GET" and watch:
        return kmock.action.WATCH
    verbs = {"GET": kmock.action.LIST, "POST": kmock.action.CREATE}
    if parsed.name is not None:
        verbs = {"GET": kmock.action.FETCH, "PATCH": kmock.action.UPDATE, "DELETE": kmock.action.DELETE}
    return verbs.get(method)


async def read_request(raw: aiohttp.web.BaseRequest) -> kmock.Request:
    """The request as kmock's handlers and criteria take it, read whole (watches and logs outlive the stream)."""
    body = await raw.read()
    text = body.decode("utf-8", errors="replace")
    try:
        data = json.loads(text) if text else None
    except ValueError:
        data = None
    parsed = parse_path(raw.path)
    resource = (
        None
        if parsed.group is None
        else kmock.resource(group=parsed.group, version=parsed.version, plural=parsed.plural)
    )
    return kmock.Request(
        method=raw.method,
        url=raw.url,
        params=dict(raw.query),
        headers=dict(raw.headers),
        cookies=dict(raw.cookies),
        body=body,
        text=text,
        data=data,
        action=action_of(parsed, raw.method.upper(), raw.query.get("watch") in ("true", "1")),
        resource=resource,
        namespace=parsed.namespace,
        name=parsed.name,
        subresource=parsed.subresource,
        raw_request=raw,
    )
