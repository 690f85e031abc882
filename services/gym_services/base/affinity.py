"""Rollout affinity: which replica of a server holds a rollout, and how a replicated server is addressed.

A server may run as several replicas (a StatefulSet's ordinal pods on Kubernetes, ``replicas:`` in a
local stack). Each replica holds the sessions, episodes, held responses and staged prefixes of the
rollouts it served, so every call of a rollout must reach the same replica — after a restore too.
Callers pick it with :func:`replica_for`: a stable hash of the rollout id over the replicas in
ordinal order (``docs/decisions.md``, "Rollout affinity is a hash of the rollout id"). It needs no
state on the caller, works for the first call of a rollout (no cookie yet) and for callers that hold
no cookies at all (the collection calling agents, agents calling the policy model), and gives the
same answer in a restored stack, whose replica ``k`` holds what the checkpointed replica ``k`` held.

A replicated server is configured as a list of base URLs in ordinal order, or as one URL with a
``{a..b}`` range standing for the ordinals (the Helm chart's form: a StatefulSet's pods under its
headless Service), expanded by :func:`expand_endpoints`::

    http://gym-workplace-assistant-{0..1}.gym-workplace-assistant-headless.default.svc:8000
    -> [http://gym-workplace-assistant-0.gym-...:8000, http://gym-workplace-assistant-1.gym-...:8000]
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated

from pydantic import AfterValidator

#: ``{first..last}`` in a URL: one URL per number, in order
RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
#: more replicas than this in one range is a typo, not a deployment
MAX_REPLICAS = 1024


def expand_endpoints(value: str | list[str]) -> list[str]:
    """The base URLs of a server, in ordinal order: a list as it is, each ``{a..b}`` range expanded.

    Raises ValueError for an empty list, a string with two ranges, a range running backwards or
    beyond :data:`MAX_REPLICAS`, or a URL that is not ``http(s)://``."""
    items = [value] if isinstance(value, str) else list(value)
    urls: list[str] = []
    for item in items:
        ranges = RANGE.findall(item)
        if len(ranges) > 1:
            raise ValueError(f"{item!r}: at most one {{a..b}} range per URL")
        if ranges:
            first, last = int(ranges[0][0]), int(ranges[0][1])
            if last < first or last - first + 1 > MAX_REPLICAS:
                raise ValueError(f"{item!r}: the range must run upwards over at most {MAX_REPLICAS} ordinals")
            urls.extend(RANGE.sub(str(n), item, count=1) for n in range(first, last + 1))
        else:
            urls.append(item)
    if not urls:
        raise ValueError("at least one URL is needed")
    for url in urls:
        if not re.match(r"^https?://[^\s/]+(/\S*)?$", url):
            raise ValueError(f"{url!r} is not an http(s) URL")
    urls = [url.rstrip("/") for url in urls]
    if len(set(urls)) != len(urls):
        raise ValueError(f"the same URL is listed twice: {urls}")
    return urls


def _checked(value: str | list[str]) -> str | list[str]:
    expand_endpoints(value)
    return value


#: a config field naming one server: its base URL, or its replicas' URLs in ordinal order (or a ``{a..b}`` range)
Endpoints = Annotated[str | list[str], AfterValidator(_checked)]


def replica_for(rollout_id: str, replicas: int) -> int:
    """The ordinal of the replica that holds ``rollout_id`` among ``replicas`` (sha256, stable everywhere)."""
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    if replicas == 1:
        return 0
    digest = hashlib.sha256(rollout_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % replicas
