"""`metadata` as kube-apiserver decodes and validates it (apimachinery's ObjectMeta).

- Decoding keeps only ObjectMeta's fields: anything else under `metadata` is dropped (and reported as
  `unknown field "metadata.x"` under `fieldValidation=Strict`/`Warn`); a field of the wrong type
  makes the body undecodable (400).
- Validation (ValidateObjectMeta): a name or generateName, the name a DNS-1123 subdomain (a label for
  the few kinds that need one), label keys and values, annotation keys and total size, finalizer names.
"""

from __future__ import annotations

import json
import re
from typing import Any

from . import fielderrors as fe
from .fielderrors import FieldError

STRING_FIELDS = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
)
KNOWN_FIELDS = frozenset(
    {
        *STRING_FIELDS,
        "generation",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)

_LABEL_FMT = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_KEY_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_DNS_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN_FMT = _DNS_LABEL_FMT + "(\\." + _DNS_LABEL_FMT + ")*"
_KEY_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)


def regex_error(message: str, fmt: str, *examples: str) -> str:
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append("must be no more than 253 characters")
    if not re.fullmatch(_DNS_SUBDOMAIN_FMT, value):
        errs.append(
            regex_error(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                "'-' or '.', and must start and end with an alphanumeric character",
                _DNS_SUBDOMAIN_FMT,
                "example.com",
            )
        )
    return errs


def dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not re.fullmatch(_DNS_LABEL_FMT, value):
        errs.append(
            regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
                "'-', and must start and end with an alphanumeric character",
                _DNS_LABEL_FMT,
                "my-name",
                "123-abc",
            )
        )
    return errs


def path_segment(value: str) -> list[str]:
    """ValidatePathSegmentName (RBAC objects): anything that can be one URL path segment."""
    if value in (".", ".."):
        return [f"may not be {json.dumps(value)}"]
    return [f"may not contain {json.dumps(bad)}" for bad in ("/", "%") if bad in value]


def qualified_name(value: str) -> list[str]:
    """IsQualifiedName: `[prefix/]name`, the prefix a DNS subdomain, the name at most 63 characters."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend(f"prefix part {msg}" for msg in dns1123_subdomain(prefix))
    else:
        return [
            "a qualified name "
            + regex_error(_KEY_MSG, _KEY_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if name and not re.fullmatch(_KEY_FMT, name):
        errs.append("name part " + regex_error(_KEY_MSG, _KEY_FMT, "MyName", "my.name", "123-abc"))
    return errs


def label_value(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not re.fullmatch(_LABEL_FMT, value):
        errs.append(
            regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, '-', "
                "'_' or '.', and must start and end with an alphanumeric character",
                _LABEL_FMT,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errs


class MetadataError(ValueError):
    """The metadata cannot be decoded into ObjectMeta (a field of the wrong type)."""


def _go_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def coerce(meta: Any, parent: str = "") -> tuple[dict[str, Any], list[str]]:
    """ObjectMeta's fields of `meta` (a copy) and the paths of the unknown ones; MetadataError if undecodable."""
    prefix = f"{parent}.metadata" if parent else "metadata"
    if not isinstance(meta, dict):
        raise MetadataError(f"json: cannot unmarshal {_go_type(meta)} into Go value of type v1.ObjectMeta")
    kept: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in meta.items():
        if key not in KNOWN_FIELDS:
            unknown.append(f"{prefix}.{key}")
            continue
        if value is None:
            continue
        expected = (
            "string"
            if key in STRING_FIELDS
            else "number"
            if key in ("generation", "deletionGracePeriodSeconds")
            else "object"
            if key in ("labels", "annotations")
            else "array"
        )
        if _go_type(value) != expected:
            raise MetadataError(
                f"json: cannot unmarshal {_go_type(value)} into Go struct field ObjectMeta.metadata."
                f"{key} of type {_go_struct_type(key)}"
            )
        if key in ("labels", "annotations"):
            for item in value.values():
                if not isinstance(item, str):
                    raise MetadataError(
                        f"json: cannot unmarshal {_go_type(item)} into Go struct field "
                        f"ObjectMeta.metadata.{key} of type string"
                    )
        if key == "finalizers" and not all(isinstance(item, str) for item in value):
            raise MetadataError(
                "json: cannot unmarshal into Go struct field ObjectMeta.metadata.finalizers of type string"
            )
        kept[key] = value
    return kept, sorted(unknown)


def _go_struct_type(key: str) -> str:
    return {
        "labels": "map[string]string",
        "annotations": "map[string]string",
        "finalizers": "[]string",
        "ownerReferences": "[]v1.OwnerReference",
        "managedFields": "[]v1.ManagedFieldsEntry",
        "generation": "int64",
        "deletionGracePeriodSeconds": "int64",
    }.get(key, "string")


def validate(
    meta: dict[str, Any], namespaced: bool, name_rule: str = "subdomain", path: str = "metadata"
) -> list[FieldError]:
    """ValidateObjectMeta for a create or an update (the server-owned fields are the server's)."""
    errs: list[FieldError] = []
    name = meta.get("name") or ""
    if not name and not meta.get("generateName"):
        errs.append(fe.required(f"{path}.name", "name or generateName is required"))
    check = {"label": dns1123_label, "path": path_segment}.get(name_rule, dns1123_subdomain)
    if name:
        errs.extend(fe.invalid(f"{path}.name", name, msg) for msg in check(name))
    if meta.get("generateName"):
        errs.extend(
            fe.invalid(f"{path}.generateName", meta["generateName"], msg) for msg in check(meta["generateName"] + "a")
        )
    if namespaced and meta.get("namespace"):
        errs.extend(fe.invalid(f"{path}.namespace", meta["namespace"], msg) for msg in dns1123_label(meta["namespace"]))
    elif not namespaced and meta.get("namespace"):
        errs.append(fe.forbidden(f"{path}.namespace", "not allowed on this type"))
    for key, value in (meta.get("labels") or {}).items():
        errs.extend(fe.invalid(f"{path}.labels", key, msg) for msg in qualified_name(key))
        errs.extend(fe.invalid(f"{path}.labels", value, msg) for msg in label_value(value))
    annotations = meta.get("annotations") or {}
    for key in annotations:
        errs.extend(fe.invalid(f"{path}.annotations", key, msg) for msg in qualified_name(key.lower()))
    if sum(len(k) + len(v) for k, v in annotations.items()) > 256 * 1024:
        errs.append(fe.too_long(f"{path}.annotations", 256 * 1024))
    for i, finalizer in enumerate(meta.get("finalizers") or []):
        errs.extend(fe.invalid(f"{path}.finalizers[{i}]", finalizer, msg) for msg in qualified_name(finalizer))
    return errs


def finalizer_warnings(new: list[str], old: list[str] | None) -> list[str]:
    """The warnings a CR write gets for new finalizers that are not domain-qualified."""
    warnings = []
    standard = {"orphan", "foregroundDeletion", "kubernetes"}
    for finalizer in sorted(set(new) - set(old or [])):
        if "/" not in finalizer and finalizer not in standard:
            hint = " including a path (/)" if "." in finalizer else ""
            warnings.append(
                f"metadata.finalizers: {json.dumps(finalizer)}: prefer a domain-qualified finalizer name"
                f"{hint} to avoid accidental conflicts with other finalizer writers"
            )
    return warnings
