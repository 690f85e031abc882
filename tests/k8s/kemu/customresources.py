"""Custom resources served from their CRD's schema, as apiextensions-apiserver serves them.

Decoding (every request body, and every object read back from storage, as the apiserver decodes etcd
data with the same codec):
1. prune fields the structural schema does not declare (unless `x-kubernetes-preserve-unknown-fields`),
   remembering their paths for `fieldValidation` (pkg/apiserver/schema/pruning);
2. drop `null` values of non-nullable fields that have no default (defaulting/prunenulls.go);
3. keep only ObjectMeta's fields under `metadata` (objectmeta.coerce);
4. apply `default:` values (defaulting/algorithm.go).

Validation (pkg/registry/customresource): apiVersion/kind, ObjectMeta, the schema (kube-openapi, see
openapi_validation), list-type=map/set uniqueness, then the CEL rules unless the schema errors include
a blocking one (Required, Unsupported value, Too long, Too many, type errors). Updates ratchet
unchanged values; `/status` writes validate `status` only (plus the CEL rules of the whole object).
"""

from __future__ import annotations

import copy
from typing import Any

from . import celrules, objectmeta
from . import fielderrors as fe
from .fielderrors import FieldError
from .openapi_validation import UNSET, SchemaValidator, to_field_errors

META_FIELDS = ("apiVersion", "kind", "metadata")
BLOCKING = {fe.NOT_SUPPORTED, fe.REQUIRED, fe.TOO_LONG, fe.TOO_MANY, fe.TYPE_INVALID}


def _structural_child(schema: dict[str, Any] | None, key: str) -> tuple[bool, dict[str, Any] | None]:
    """(declared, schema) of a field under `schema` (properties, then additionalProperties)."""
    if schema is None:
        return False, None
    props = schema.get("properties") or {}
    if key in props:
        return True, props[key]
    extra = schema.get("additionalProperties")
    if extra is not None and extra is not False:
        return True, extra if isinstance(extra, dict) else None
    return False, None


def prune(value: Any, schema: dict[str, Any] | None, path: str, unknown: list[str], embedded: bool = False) -> None:
    """pruning.prune: drop undeclared fields (in place), recording their paths."""
    if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields"):
        _skip_prune(value, schema, path, unknown)
        return
    embedded = embedded or bool(schema and schema.get("x-kubernetes-embedded-resource"))
    if isinstance(value, dict):
        for key in list(value):
            if embedded and key in META_FIELDS:
                continue
            declared, sub = _structural_child(schema, key)
            if declared:
                prune(value[key], sub, f"{path}.{key}" if path else key, unknown)
            else:
                if key not in META_FIELDS or path:
                    unknown.append(f"{path}.{key}" if path else key)
                del value[key]
    elif isinstance(value, list):
        items = schema.get("items") if schema is not None and isinstance(schema.get("items"), dict) else None
        for i, item in enumerate(value):
            prune(item, items, f"{path}[{i}]", unknown)


def _skip_prune(value: Any, schema: dict[str, Any], path: str, unknown: list[str]) -> None:
    embedded = bool(schema.get("x-kubernetes-embedded-resource"))
    if isinstance(value, dict):
        for key in list(value):
            if embedded and key in META_FIELDS:
                continue
            declared, sub = _structural_child(schema, key)
            if declared:
                prune(value[key], sub, f"{path}.{key}" if path else key, unknown)
    elif isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else None
        for i, item in enumerate(value):
            if items is not None:
                _skip_prune(item, items, f"{path}[{i}]", unknown)


def prune_nulls(value: Any, schema: dict[str, Any] | None) -> None:
    """PruneNonNullableNullsWithoutDefaults."""
    if isinstance(value, dict):
        for key in list(value):
            _, sub = _structural_child(schema, key)
            if value[key] is None and sub is not None and not sub.get("nullable") and "default" not in sub:
                del value[key]
            else:
                prune_nulls(value[key], sub)
    elif isinstance(value, list):
        items = schema.get("items") if schema is not None and isinstance(schema.get("items"), dict) else None
        for item in value:
            prune_nulls(item, items)


def apply_defaults(value: Any, schema: dict[str, Any] | None) -> None:
    """defaulting.Default: missing (or non-nullable null) fields get their schema's default, recursively."""
    if schema is None:
        return
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, prop in props.items():
            if "default" not in prop:
                continue
            if key not in value or (value[key] is None and not prop.get("nullable")):
                value[key] = copy.deepcopy(prop["default"])
        extra = schema.get("additionalProperties")
        for key in list(value):
            if key in props:
                apply_defaults(value[key], props[key])
            elif isinstance(extra, dict):
                if value[key] is None and not extra.get("nullable") and "default" in extra:
                    value[key] = copy.deepcopy(extra["default"])
                apply_defaults(value[key], extra)
    elif isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else None
        if items is None:
            return
        for i, item in enumerate(value):
            if item is None and not items.get("nullable") and "default" in items:
                value[i] = copy.deepcopy(items["default"])
            apply_defaults(value[i], items)


def _coerce_integers(value: Any, schema: dict[str, Any] | None) -> Any:
    """A JSON number like 3.0 in an integer field decodes to an integer (Go's json -> int64 round trip)."""
    if schema is None:
        return value
    if isinstance(value, float) and value.is_integer() and schema.get("type") == "integer":
        return int(value)
    if isinstance(value, dict):
        for key in value:
            _, sub = _structural_child(schema, key)
            value[key] = _coerce_integers(value[key], sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            value[i] = _coerce_integers(item, schema["items"])
    return value


def list_type_errors(value: Any, schema: dict[str, Any] | None, path: str) -> list[FieldError]:
    """listtype.ValidateListSetsAndMaps: list-type=set items and list-type=map keys are unique."""
    errs: list[FieldError] = []
    if schema is None:
        return errs
    if isinstance(value, dict):
        for key, item in value.items():
            declared, sub = _structural_child(schema, key)
            if declared and sub is not None:
                if key in (schema.get("properties") or {}):
                    sub_path = f"{path}.{key}" if path else key
                else:
                    sub_path = f"{path}[{key}]"
                errs.extend(list_type_errors(item, sub, sub_path))
    elif isinstance(value, list):
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set":
            seen: list[Any] = []
            reported: set[int] = set()
            for i, item in enumerate(value):
                matches = [j for j, other in enumerate(seen) if other == item]
                if matches and matches[0] not in reported:
                    reported.add(matches[0])
                    errs.append(fe.duplicate(f"{path}[{i}]", item))
                seen.append(item)
        elif list_type == "map":
            keys = schema.get("x-kubernetes-list-map-keys") or []
            for i, item in enumerate(value):
                if item is not None and not isinstance(item, dict):
                    return [fe.invalid(f"{path}[{i}]", item, "must be an object for an array of list-type map")]
            seen_keys: list[Any] = []
            for i, item in enumerate(value):
                key_value = {k: item.get(k) for k in keys if isinstance(item, dict) and k in item}
                if key_value in seen_keys:
                    errs.append(fe.duplicate(f"{path}[{i}]", key_value))
                else:
                    seen_keys.append(key_value)
        items = schema.get("items") if isinstance(schema.get("items"), dict) else None
        if items is not None:
            for i, item in enumerate(value):
                errs.extend(list_type_errors(item, items, f"{path}[{i}]"))
    return errs


class CustomResource:
    """One served version of a CRD: its schema, subresources and names."""

    def __init__(self, crd: dict[str, Any], version: dict[str, Any]) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        self.group: str = spec.get("group") or ""
        self.version: str = version["name"]
        self.kind: str = names.get("kind") or ""
        self.plural: str = names.get("plural") or ""
        self.namespaced = spec.get("scope", "Namespaced") == "Namespaced"
        self.preserve_unknown = bool(spec.get("preserveUnknownFields"))
        self.schema: dict[str, Any] | None = (version.get("schema") or {}).get("openAPIV3Schema")
        self.subresources = set((version.get("subresources") or {}).keys())
        self.validator = SchemaValidator(self.schema) if self.schema else None
        status_schema = ((self.schema or {}).get("properties") or {}).get("status")
        self.status_validator = SchemaValidator(status_schema) if status_schema else None
        self.cel = celrules.Validator(self.schema) if self.schema and celrules.has_rules(self.schema) else None

    @property
    def group_kind(self) -> str:
        return f"{self.kind}.{self.group}"

    # ---- decoding ----

    def decode(self, obj: dict[str, Any]) -> list[str]:
        """Prune, drop nulls, coerce metadata and default `obj` in place; the unknown fields' paths."""
        unknown: list[str] = []
        if "metadata" in obj:
            meta, meta_unknown = objectmeta.coerce(obj["metadata"])
            obj["metadata"] = meta
            unknown.extend(meta_unknown)
        if not self.preserve_unknown:
            prune(obj, self.schema, "", unknown, embedded=True)
            prune_nulls(obj, self.schema)
        _coerce_integers(obj, self.schema)
        apply_defaults(obj, self.schema)
        return sorted(unknown)

    def read(self, obj: dict[str, Any]) -> dict[str, Any]:
        """An object as a read returns it: decoded from storage with today's schema (pruned, defaulted)."""
        view = copy.deepcopy(obj)
        try:
            self.decode(view)
        except objectmeta.MetadataError:
            return copy.deepcopy(obj)
        return view

    # ---- validation ----

    def _type_meta(self, obj: dict[str, Any]) -> list[FieldError]:
        errs = []
        if obj.get("kind") != self.kind:
            errs.append(fe.invalid("kind", obj.get("kind") or "", f"must be {self.kind}"))
        if obj.get("apiVersion") != f"{self.group}/{self.version}":
            errs.append(fe.invalid("apiVersion", obj.get("apiVersion") or "", f"must be {self.group}/{self.version}"))
        return errs

    def _schema_errors(self, obj: Any, old: Any) -> list[FieldError]:
        if self.validator is None:
            return []
        return to_field_errors(self.validator.validate(obj, old))

    def _cel(self, errs: list[FieldError], obj: dict[str, Any], old: Any) -> tuple[list[FieldError], list[str]]:
        if self.cel is None:
            return [], []
        if any(error.type in BLOCKING for error in errs):
            return [
                fe.invalid(
                    "<nil>",
                    None,
                    "some validation rules were not checked because the object was "
                    "invalid; correct the existing errors to complete validation",
                )
            ], []
        return self.cel.validate(obj, old)

    def validate_create(self, obj: dict[str, Any]) -> tuple[list[FieldError], list[str]]:
        errs = self._type_meta(obj)
        if errs:
            return errs, []
        errs.extend(objectmeta.validate(obj.get("metadata") or {}, self.namespaced))
        errs.extend(self._schema_errors(obj, UNSET))
        errs.extend(list_type_errors(obj, self.schema, ""))
        cel_errs, warnings = self._cel(errs, obj, UNSET)
        warnings = objectmeta.finalizer_warnings((obj.get("metadata") or {}).get("finalizers") or [], None) + warnings
        return errs + cel_errs, warnings

    def validate_update(self, new: dict[str, Any], old: dict[str, Any]) -> tuple[list[FieldError], list[str]]:
        errs = self._type_meta(new)
        if errs:
            return errs, []
        errs.extend(objectmeta.validate(new.get("metadata") or {}, self.namespaced))
        errs.extend(self._schema_errors(new, old))
        if not list_type_errors(old, self.schema, ""):
            errs.extend(list_type_errors(new, self.schema, ""))
        cel_errs, warnings = self._cel(errs, new, old)
        warnings = (
            objectmeta.finalizer_warnings(
                (new.get("metadata") or {}).get("finalizers") or [], (old.get("metadata") or {}).get("finalizers") or []
            )
            + warnings
        )
        return errs + cel_errs, warnings

    def validate_status_update(self, new: dict[str, Any], old: dict[str, Any]) -> tuple[list[FieldError], list[str]]:
        errs = self._type_meta(new)
        if errs:
            return errs, []
        errs.extend(objectmeta.validate(new.get("metadata") or {}, self.namespaced))
        if "status" in new and self.status_validator is not None:
            errs.extend(
                to_field_errors(
                    self.status_validator.validate(new["status"], old.get("status", UNSET)), prefix="status"
                )
            )
        new_list_errs = list_type_errors(new, self.schema, "")
        if new_list_errs and not list_type_errors(old, self.schema, ""):
            errs.extend(new_list_errs)
        cel_errs, warnings = self._cel(errs, new, old)
        return errs + cel_errs, warnings


def validate_crd(crd: dict[str, Any]) -> list[FieldError]:
    """The part of CRD validation the emulator does: x-kubernetes-validations rules must compile."""
    errs: list[FieldError] = []
    for i, version in enumerate((crd.get("spec") or {}).get("versions") or []):
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if isinstance(schema, dict):
            errs.extend(celrules.compile_errors(schema, f"spec.versions[{i}].schema.openAPIV3Schema"))
    return errs
