"""Decoding the Kubernetes protobuf wire format for the few kinds clients send that way.

client-go's typed clients (kubectl `create ns/cm/secret`, Helm's release storage) post
`application/vnd.kubernetes.protobuf` bodies: the magic `k8s\\0`, then a `runtime.Unknown`
envelope holding the type and the raw message. Field numbers follow k8s.io/api's generated.proto.
Only the kinds of TOP_LEVEL_KINDS (Secret, ConfigMap, Namespace, DeleteOptions, ServiceAccount, RBAC
kinds, TokenRequest and the self reviews kubectl sends) are decoded; anything else raises
`UnsupportedKind` so the server can answer a clear 415 instead of crashing.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Iterator
from typing import Any

MAGIC = b"k8s\x00"

# A field spec: (json name, type, repeated). Types: 'string', 'bytes', 'int', 'bool', 'time',
# 'map:string', 'map:bytes', or the name of a message in MESSAGES.
FieldSpec = tuple[str, str, bool]

MESSAGES: dict[str, dict[int, FieldSpec]] = {
    "TypeMeta": {1: ("apiVersion", "string", False), 2: ("kind", "string", False)},
    "Unknown": {
        1: ("typeMeta", "TypeMeta", False),
        2: ("raw", "raw", False),
        3: ("contentEncoding", "string", False),
        4: ("contentType", "string", False),
    },
    "ObjectMeta": {
        1: ("name", "string", False),
        2: ("generateName", "string", False),
        3: ("namespace", "string", False),
        4: ("selfLink", "string", False),
        5: ("uid", "string", False),
        6: ("resourceVersion", "string", False),
        7: ("generation", "int", False),
        8: ("creationTimestamp", "time", False),
        9: ("deletionTimestamp", "time", False),
        10: ("deletionGracePeriodSeconds", "int", False),
        11: ("labels", "map:string", False),
        12: ("annotations", "map:string", False),
        13: ("ownerReferences", "OwnerReference", True),
        14: ("finalizers", "string", True),
    },
    "OwnerReference": {
        1: ("kind", "string", False),
        3: ("name", "string", False),
        4: ("uid", "string", False),
        5: ("apiVersion", "string", False),
        6: ("controller", "bool", False),
        7: ("blockOwnerDeletion", "bool", False),
    },
    "Secret": {
        1: ("metadata", "ObjectMeta", False),
        2: ("data", "map:bytes", False),
        3: ("type", "string", False),
        4: ("stringData", "map:string", False),
        5: ("immutable", "bool", False),
    },
    "ConfigMap": {
        1: ("metadata", "ObjectMeta", False),
        2: ("data", "map:string", False),
        3: ("binaryData", "map:bytes", False),
        4: ("immutable", "bool", False),
    },
    "Namespace": {
        1: ("metadata", "ObjectMeta", False),
        2: ("spec", "NamespaceSpec", False),
        3: ("status", "NamespaceStatus", False),
    },
    "NamespaceSpec": {1: ("finalizers", "string", True)},
    "NamespaceStatus": {1: ("phase", "string", False)},
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "int", False),
        2: ("preconditions", "Preconditions", False),
        3: ("orphanDependents", "bool", False),
        4: ("propagationPolicy", "string", False),
        5: ("dryRun", "string", True),
    },
    "Preconditions": {1: ("uid", "string", False), 2: ("resourceVersion", "string", False)},
    "ObjectReference": {
        1: ("kind", "string", False),
        2: ("namespace", "string", False),
        3: ("name", "string", False),
        4: ("uid", "string", False),
        5: ("apiVersion", "string", False),
    },
    "LocalObjectReference": {1: ("name", "string", False)},
    "ServiceAccount": {
        1: ("metadata", "ObjectMeta", False),
        2: ("secrets", "ObjectReference", True),
        3: ("imagePullSecrets", "LocalObjectReference", True),
        4: ("automountServiceAccountToken", "bool", False),
    },
    # authentication.k8s.io/v1
    "TokenRequest": {1: ("metadata", "ObjectMeta", False), 2: ("spec", "TokenRequestSpec", False)},
    "TokenRequestSpec": {
        1: ("audiences", "string", True),
        3: ("boundObjectRef", "BoundObjectReference", False),
        4: ("expirationSeconds", "int", False),
    },
    "BoundObjectReference": {
        1: ("kind", "string", False),
        2: ("apiVersion", "string", False),
        3: ("name", "string", False),
        4: ("uid", "string", False),
    },
    "SelfSubjectReview": {1: ("metadata", "ObjectMeta", False)},
    # authorization.k8s.io/v1
    "SelfSubjectAccessReview": {
        1: ("metadata", "ObjectMeta", False),
        2: ("spec", "SelfSubjectAccessReviewSpec", False),
    },
    "SelfSubjectAccessReviewSpec": {
        1: ("resourceAttributes", "ResourceAttributes", False),
        2: ("nonResourceAttributes", "NonResourceAttributes", False),
    },
    "ResourceAttributes": {
        1: ("namespace", "string", False),
        2: ("verb", "string", False),
        3: ("group", "string", False),
        4: ("version", "string", False),
        5: ("resource", "string", False),
        6: ("subresource", "string", False),
        7: ("name", "string", False),
    },
    "NonResourceAttributes": {1: ("path", "string", False), 2: ("verb", "string", False)},
    # rbac.authorization.k8s.io/v1
    "PolicyRule": {
        1: ("verbs", "string", True),
        2: ("apiGroups", "string", True),
        3: ("resources", "string", True),
        4: ("resourceNames", "string", True),
        5: ("nonResourceURLs", "string", True),
    },
    "RoleRef": {1: ("apiGroup", "string", False), 2: ("kind", "string", False), 3: ("name", "string", False)},
    "Subject": {
        1: ("kind", "string", False),
        2: ("apiGroup", "string", False),
        3: ("name", "string", False),
        4: ("namespace", "string", False),
    },
    "Role": {1: ("metadata", "ObjectMeta", False), 2: ("rules", "PolicyRule", True)},
    "ClusterRole": {1: ("metadata", "ObjectMeta", False), 2: ("rules", "PolicyRule", True)},
    "RoleBinding": {
        1: ("metadata", "ObjectMeta", False),
        2: ("subjects", "Subject", True),
        3: ("roleRef", "RoleRef", False),
    },
    "ClusterRoleBinding": {
        1: ("metadata", "ObjectMeta", False),
        2: ("subjects", "Subject", True),
        3: ("roleRef", "RoleRef", False),
    },
}

TOP_LEVEL_KINDS = frozenset(
    {
        "Secret",
        "ConfigMap",
        "Namespace",
        "DeleteOptions",
        "ServiceAccount",
        "TokenRequest",
        "SelfSubjectReview",
        "SelfSubjectAccessReview",
        "Role",
        "ClusterRole",
        "RoleBinding",
        "ClusterRoleBinding",
    }
)


class ProtobufError(ValueError):
    """The body is not valid Kubernetes protobuf."""


class UnsupportedKind(ProtobufError):
    """A well-formed envelope of a kind this decoder does not know."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtobufError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Yield (field number, value): ints for varint/fixed fields, bytes for length-delimited ones."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise ProtobufError("truncated field")
            yield number, buf[pos : pos + length]
            pos += length
        elif wire == 1:
            yield number, int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        elif wire == 5:
            yield number, int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


GO_ZERO_TIME = -62135596800  # 0001-01-01T00:00:00Z: what an unset metav1.Time marshals as


def _time(buf: bytes) -> str | None:
    seconds = 0
    for number, value in _fields(buf):
        if number == 1 and isinstance(value, int):
            seconds = _signed(value)
    if seconds <= GO_ZERO_TIME:
        return None
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _map_entry(buf: bytes, value_type: str) -> tuple[str, str]:
    key, value = "", b""
    for number, item in _fields(buf):
        if number == 1 and isinstance(item, bytes):
            key = item.decode("utf-8")
        elif number == 2 and isinstance(item, bytes):
            value = item
    if value_type == "bytes":
        return key, base64.b64encode(value).decode("ascii")
    return key, value.decode("utf-8")


def _scalar(kind: str, value: int | bytes) -> Any:
    if kind == "string" and isinstance(value, bytes):
        return value.decode("utf-8")
    if kind == "bytes" and isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if kind == "raw" and isinstance(value, bytes):
        return value
    if kind == "int" and isinstance(value, int):
        return _signed(value)
    if kind == "bool" and isinstance(value, int):
        return bool(value)
    if kind == "time" and isinstance(value, bytes):
        return _time(value)
    if kind in MESSAGES and isinstance(value, bytes):
        return decode_message(kind, value)
    raise ProtobufError(f"wire type does not match field type {kind}")


def decode_message(name: str, buf: bytes) -> dict[str, Any]:
    """Decode one message by its schema; unknown field numbers (e.g. managedFields) are skipped."""
    schema = MESSAGES[name]
    out: dict[str, Any] = {}
    for number, value in _fields(buf):
        spec = schema.get(number)
        if spec is None:
            continue
        field, kind, repeated = spec
        if kind.startswith("map:"):
            if not isinstance(value, bytes):
                raise ProtobufError(f"map field {field} is not length-delimited")
            key, item = _map_entry(value, kind[4:])
            out.setdefault(field, {})[key] = item
        elif repeated:
            out.setdefault(field, []).append(_scalar(kind, value))
        else:
            decoded = _scalar(kind, value)
            if decoded not in ("", None):  # gogo-proto writes unset strings and times; JSON omits them
                out[field] = decoded
    return out


def decode(body: bytes) -> dict[str, Any]:
    """Decode a `k8s\\0`-prefixed body into the JSON form of the object, with apiVersion and kind."""
    if not body.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf magic prefix")
    envelope = decode_message("Unknown", body[len(MAGIC) :])
    type_meta = envelope.get("typeMeta", {})
    kind = type_meta.get("kind", "")
    if kind not in TOP_LEVEL_KINDS:
        raise UnsupportedKind(kind)
    obj = decode_message(kind, envelope.get("raw", b""))
    return {"apiVersion": type_meta.get("apiVersion", "v1"), "kind": kind, **obj}
