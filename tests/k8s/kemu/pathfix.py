"""A corrected `kmock._internal.parsing.parse_path`.

kmock 0.8 reads `/api/v1/namespaces` and `/api/v1/namespaces/<name>` as a namespace prefix with no
resource and fails with `ValueError: not enough values to unpack` (HTTP 500): `kubectl create ns`,
`kubectl get ns` and kopf's namespaced mode all hit it. Here `namespaces/<ns>/` is a prefix only
when a resource follows it, and `namespaces/<name>/status|finalize` are the Namespace's subresources.
"""
from __future__ import annotations

from kmock._internal.parsing import ParsedPath

NAMESPACE_SUBRESOURCES = frozenset({'status', 'finalize'})


def parse_path(path: str) -> ParsedPath:
    parts = path.strip('/').split('/')
    if len(parts) >= 2 and parts[0] == 'apis':
        group, version, rest = parts[1], (parts[2] if len(parts) > 2 else None), parts[3:]
    elif len(parts) >= 2 and parts[0] == 'api':
        group, version, rest = '', parts[1], parts[2:]
    else:
        return ParsedPath()
    namespace = None
    if len(rest) >= 3 and rest[0] == 'namespaces' and rest[2] not in NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest and rest[0] else None
    name = rest[1] if len(rest) > 1 and rest[1] else None
    subresource = '/'.join(part for part in rest[2:] if part) or None
    return ParsedPath(group, version, plural, namespace, name, subresource)
