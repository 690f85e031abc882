"""A corrected path parser for kmock 0.8, installed in place of `kmock._internal.parsing.parse_path`.

kmock 0.8 reads `/api/v1/namespaces` and `/api/v1/namespaces/<name>` as a namespace prefix with no
resource and fails with `ValueError: not enough values to unpack` (HTTP 500): `kubectl create ns`,
`kubectl get ns` and kopf's namespaced mode all hit it. Here `namespaces/<ns>/` is a prefix only
when a resource follows it, and `namespaces/<name>/status|finalize` are the Namespace's subresources.

kmock builds every request's group/version/plural/namespace/name/subresource with that module function
and offers no public hook for it, so :func:`install` replaces it: the only use of kmock's internals in
kemu (everything else uses kmock's public names). It refuses any kmock but the 0.8 this was written
against, so an upgrade that changes the parser fails loudly here instead of misrouting requests. The
parser below is kemu's own (not a copy of kmock's); the fix belongs upstream in kmock (by nolar).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import kmock

KMOCK_VERSION = "0.8"

NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@dataclass(frozen=True)
class ParsedPath:
    """What kmock reads from a parsed path (by attribute)."""

    group: str | None = None
    version: str | None = None
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def install() -> None:
    """Replace kmock's path parser with :func:`parse_path` (kmock 0.8 only)."""
    if kmock.__version__ != KMOCK_VERSION:
        raise RuntimeError(
            f"kemu patches the path parser of kmock {KMOCK_VERSION}, not {kmock.__version__}: "
            "check kmock._internal.parsing.parse_path still fails on /api/v1/namespaces, then update "
            "tests/k8s/kemu/pathfix.py"
        )
    importlib.import_module("kmock._internal.parsing").parse_path = parse_path


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
