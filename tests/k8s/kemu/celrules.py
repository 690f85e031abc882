"""`x-kubernetes-validations` rules evaluated with a real CEL implementation (common-expression-language).

Follows apiextensions-apiserver pkg/apiserver/schema/cel/validation.go:

- each schema node's rules see `self` (the node's value, typed by its schema: `number` as double,
  `format: date-time`/`date` as timestamp, `duration` as duration, `byte` as bytes); the root also sees
  `apiVersion`, `kind` and `metadata.name`/`generateName` only;
- null values are not validated; transition rules (those naming `oldSelf`) run only on updates where
  the old value correlates (object fields, list-type=map items by key), unless `optionalOldSelf`;
- a false rule gives a field error at the node (or at its `fieldPath`) with `message`, the evaluated
  `messageExpression`, or `failed rule: <rule>`; the value is omitted for objects and arrays; `reason`
  picks the error type;
- an evaluation error gives `Invalid value: "<type>": <error> evaluating rule: <rule>`;
- on updates, a failing rule without `oldSelf` whose value did not change is a warning, not an error
  (ratcheting).

Kubernetes' CEL libraries are provided in part (strings, lists, regex, `isURL`); see
tests/k8s/README.md for what is not (cost limits, static type checking, quantity/IP/semver).
"""

from __future__ import annotations

import datetime
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

import cel

from . import fielderrors as fe
from .fielderrors import FieldError
from .openapi_validation import UNSET, _json_equal, correlate_list, go_regex, parse_datetime, parse_duration

SELF, OLD_SELF = "self", "oldSelf"


class CompileError(ValueError):
    pass


@dataclass
class Rule:
    rule: str
    message: str
    message_expression: str
    reason: str | None
    field_path: str
    optional_old_self: bool
    program: Any
    message_program: Any
    uses_old_self: bool


_PROGRAMS: dict[str, Any] = {}


def compile_expression(source: str) -> Any:
    program = _PROGRAMS.get(source)
    if program is None:
        try:
            program = cel.compile(source)
        except (ValueError, RuntimeError) as exc:
            raise CompileError(str(exc)) from exc
        _PROGRAMS[source] = program
    return program


def compile_rule(spec: dict[str, Any]) -> Rule:
    program = compile_expression(spec.get("rule") or "true")
    message_expression = spec.get("messageExpression") or ""
    return Rule(
        rule=(spec.get("rule") or "").strip(),
        message=(spec.get("message") or "").strip(),
        message_expression=message_expression,
        reason=spec.get("reason"),
        field_path=spec.get("fieldPath") or "",
        optional_old_self=bool(spec.get("optionalOldSelf")),
        program=program,
        message_program=compile_expression(message_expression) if message_expression else None,
        uses_old_self=OLD_SELF in program.variables(),
    )


def compile_errors(schema: dict[str, Any], path: str) -> list[FieldError]:
    """Rules that do not compile, as the CRD validation reports them (a CRD with one is refused)."""
    errs: list[FieldError] = []
    for i, spec in enumerate(schema.get("x-kubernetes-validations") or []):
        for key in ("rule", "messageExpression"):
            if spec.get(key):
                try:
                    compile_expression(spec[key])
                except CompileError as exc:
                    errs.append(
                        fe.invalid(
                            f"{path}.x-kubernetes-validations[{i}].{key}", spec[key], f"compilation failed: {exc}"
                        )
                    )
    for name, sub in (schema.get("properties") or {}).items():
        errs.extend(compile_errors(sub, f"{path}.properties[{name}]"))
    if isinstance(schema.get("items"), dict):
        errs.extend(compile_errors(schema["items"], f"{path}.items"))
    if isinstance(schema.get("additionalProperties"), dict):
        errs.extend(compile_errors(schema["additionalProperties"], f"{path}.additionalProperties"))
    for i, sub in enumerate(schema.get("allOf") or []):
        errs.extend(compile_errors(sub, f"{path}.allOf[{i}]"))
    return errs


# ---- Kubernetes CEL libraries (the parts CRD rules use most) ----


def _index_of(target: Any, item: Any, start: int = 0) -> int:
    if isinstance(target, str):
        return target.find(item, start)
    for i, value in enumerate(list(target)):
        if _json_equal(value, item):
            return i
    return -1


def _last_index_of(target: Any, item: Any, *rest: Any) -> int:
    if isinstance(target, str):
        return target.rfind(item) if not rest else target.rfind(item, 0, rest[0] + len(item))
    found = -1
    for i, value in enumerate(list(target)):
        if _json_equal(value, item):
            found = i
    return found


def _split(text: str, sep: str, limit: int = -1) -> list[str]:
    if limit == 0:
        return []
    return text.split(sep) if limit < 0 else text.split(sep, limit - 1)


def _substring(text: str, start: int, end: int | None = None) -> str:
    if start < 0 or start > len(text) or (end is not None and (end < start or end > len(text))):
        raise IndexError(f"index out of range: {start if end is None or start < 0 else end}")
    return text[start:end]


def _is_url(text: str) -> bool:
    parsed = urllib.parse.urlparse(text)
    return (bool(parsed.scheme) and (bool(parsed.netloc) or text.startswith("/"))) or text.startswith("/")


LIBRARY = {
    "charAt": lambda s, i: s[i] if i < len(s) else "",
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": lambda s: "".join(c.lower() if c.isascii() else c for c in s),
    "upperAscii": lambda s: "".join(c.upper() if c.isascii() else c for c in s),
    "replace": lambda s, old, new, n=-1: s.replace(old, new, n),
    "split": _split,
    "substring": _substring,
    "trim": lambda s: s.strip(),
    "join": lambda items, sep="": sep.join(items),
    "reverse": lambda s: s[::-1],
    "isSorted": lambda items: list(items) == sorted(items),
    "sum": lambda items: sum(items),
    "min": lambda items: min(items),
    "max": lambda items: max(items),
    "find": lambda s, pattern: m.group(0) if (m := go_regex(pattern).search(s)) else "",
    "findAll": lambda s, pattern, n=-1: [m.group(0) for m in go_regex(pattern).finditer(s)][: None if n < 0 else n],
    "isURL": _is_url,
}


def _context(variables: dict[str, Any]) -> Any:
    ctx = cel.Context(variables)
    for name, function in LIBRARY.items():
        ctx.add_function(name, function)
    return ctx


def _error_text(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"no such key: {exc.args[0] if exc.args else ''}"
    if isinstance(exc, ZeroDivisionError):
        return "division by zero"
    if isinstance(exc, OverflowError):
        return "integer overflow"
    if isinstance(exc, TypeError):
        return "no such overload"
    return str(exc)


# ---- values as CEL sees them ----


def to_cel(value: Any, schema: dict[str, Any] | None, root: bool = False) -> Any:
    if value is None or schema is None:
        return value
    kind = schema.get("type")
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
            return value
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            if root and key == "metadata":
                out[key] = {k: v for k, v in (item or {}).items() if k in ("name", "generateName")}
            elif root and key in ("apiVersion", "kind"):
                out[key] = item
            elif key in props:
                out[key] = to_cel(item, props[key])
            elif isinstance(extra, dict):
                out[key] = to_cel(item, extra)
            else:
                out[key] = item
        return out
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else None
        return [to_cel(item, items) for item in value]
    if kind == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind == "string" and isinstance(value, str):
        fmt = schema.get("format")
        if fmt in ("date-time", "date"):
            parsed = parse_datetime(value if fmt == "date-time" else f"{value}T00:00:00Z")
            return parsed if parsed is not None else value
        if fmt == "duration":
            parsed_duration = parse_duration(value)
            return parsed_duration if parsed_duration is not None else value
        if fmt == "byte":
            import base64

            try:
                return base64.b64decode(value)
            except ValueError:
                return value
    return value


def _type_name(schema: dict[str, Any]) -> str:
    return schema.get("type") or ("object" if schema.get("properties") else "")


def _rule_text(rule: Rule) -> str:
    return rule.message or rule.rule


def _normalize_field_path(field_path: str) -> str:
    """`.spec.x` or `.spec['x']` -> `spec.x` (the apiserver's normalized rule field path)."""
    text = re.sub(r"\['([^']*)'\]", r".\1", field_path)
    return text.lstrip(".")


class Validator:
    """Evaluates every rule of a structural schema against an object (and its old value)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self._compiled: dict[int, list[Rule]] = {}

    def _rules(self, schema: dict[str, Any]) -> list[Rule]:
        key = id(schema)
        if key not in self._compiled:
            self._compiled[key] = [compile_rule(spec) for spec in schema.get("x-kubernetes-validations") or []]
        return self._compiled[key]

    def validate(self, obj: Any, old: Any = UNSET, path: str = "") -> tuple[list[FieldError], list[str]]:
        errors: list[FieldError] = []
        warnings: list[str] = []
        self._walk(self.schema, obj, old, path, old is not UNSET and _json_equal(obj, old), True, errors, warnings)
        return errors, warnings

    def _walk(
        self,
        schema: dict[str, Any],
        obj: Any,
        old: Any,
        path: str,
        unchanged: bool,
        root: bool,
        errors: list[FieldError],
        warnings: list[str],
    ) -> None:
        if obj is None:
            return
        self._expressions(schema, obj, old, path, unchanged, root, errors, warnings)
        for sub in schema.get("allOf") or []:
            self._walk(sub, obj, UNSET, path, unchanged, root, errors, warnings)
        if isinstance(obj, dict):
            correlatable = schema.get("x-kubernetes-map-type") in (None, "granular", "atomic")
            old_map = old if isinstance(old, dict) and correlatable else {}
            extra = schema.get("additionalProperties")
            props = schema.get("properties") or {}
            for key, value in obj.items():
                if key in props:
                    sub_schema, sub_path = props[key], f"{path}.{key}" if path else key
                elif isinstance(extra, dict):
                    sub_schema, sub_path = extra, f"{path}[{key}]"
                else:
                    continue
                sub_old = old_map.get(key, UNSET) if old is not UNSET else UNSET
                sub_unchanged = (
                    _json_equal(value, sub_old) if sub_old is not UNSET else (unchanged and not correlatable)
                )
                self._walk(sub_schema, value, sub_old, sub_path, sub_unchanged, False, errors, warnings)
        elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
            old_items = correlate_list(schema, obj, old)
            for i, item in enumerate(obj):
                sub_old = old_items[i]
                sub_unchanged = _json_equal(item, sub_old) if sub_old is not UNSET else unchanged
                self._walk(schema["items"], item, sub_old, f"{path}[{i}]", sub_unchanged, False, errors, warnings)

    def _expressions(
        self,
        schema: dict[str, Any],
        obj: Any,
        old: Any,
        path: str,
        unchanged: bool,
        root: bool,
        errors: list[FieldError],
        warnings: list[str],
    ) -> None:
        rules = self._rules(schema)
        if not rules:
            return
        here = path or "<nil>"
        type_name = _type_name(schema)
        self_value = to_cel(obj, schema, root)
        old_value = to_cel(old, schema, root) if old is not UNSET and old is not None else UNSET
        for rule in rules:
            variables: dict[str, Any] = {SELF: self_value}
            if rule.uses_old_self:
                if old_value is UNSET:
                    if not rule.optional_old_self:
                        continue
                    variables[OLD_SELF] = cel.OptionalValue.none()
                else:
                    variables[OLD_SELF] = cel.OptionalValue.of(old_value) if rule.optional_old_self else old_value
            try:
                result = rule.program.execute(_context(variables))
            except Exception as exc:  # CEL runtime errors: no such key, overflow, no such overload, ...
                text = _error_text(exc)
                if text.startswith("no such overload"):
                    detail = (
                        f"'{text}': call arguments did not match a supported operator, function or macro "
                        f"signature for rule: {_rule_text(rule)}"
                    )
                else:
                    detail = f"{text} evaluating rule: {_rule_text(rule)}"
                errors.append(fe.invalid(here, type_name, detail))
                continue
            if result is True:
                continue
            target = here
            if rule.field_path:
                normalized = _normalize_field_path(rule.field_path)
                target = f"{path}.{normalized}" if path else normalized
            detail = ""
            if rule.message_program is not None:
                try:
                    message = rule.message_program.execute(_context(variables))
                    if isinstance(message, str) and message.strip() and "\n" not in message.strip():
                        detail = message.strip()
                except Exception:  # a failing messageExpression falls back to the message
                    detail = ""
            if not detail:
                detail = rule.message or f"failed rule: {rule.rule}"
            value = fe.OMIT if type_name in ("object", "array") else obj
            reason = rule.reason
            if reason == "FieldValueForbidden":
                error = fe.forbidden(target, detail)
            elif reason == "FieldValueRequired":
                error = fe.required(target, detail)
            elif reason == "FieldValueDuplicate":
                error = fe.duplicate(target, value)
            else:
                error = fe.invalid(target, value, detail)
            if not rule.uses_old_self and unchanged:
                warnings.append(str(error))
            else:
                errors.append(error)


def has_rules(schema: dict[str, Any]) -> bool:
    if schema.get("x-kubernetes-validations"):
        return True
    children = list((schema.get("properties") or {}).values()) + list(schema.get("allOf") or [])
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            children.append(schema[key])
    return any(has_rules(child) for child in children)


_ = datetime  # timestamps reach CEL as datetime values
