"""Field errors rendered the way kube-apiserver renders them (k8s.io/apimachinery `field.Error`).

A 422 `Invalid` answer carries one `details.causes` entry per field error (`reason` is the error
type, `message` the error body, `field` the path) and a message `<Kind>.<group> "<name>" is invalid:
<errors>`, the errors joined as `[a, b]` when there are several (duplicates dropped), exactly as
`apierrors.NewInvalid` builds it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

OMIT = type("OmitValue", (), {"__repr__": lambda self: "OMIT"})()  # field.OmitValueType{}

REQUIRED = "FieldValueRequired"
NOT_FOUND = "FieldValueNotFound"
DUPLICATE = "FieldValueDuplicate"
INVALID = "FieldValueInvalid"
NOT_SUPPORTED = "FieldValueNotSupported"
FORBIDDEN = "FieldValueForbidden"
TOO_LONG = "FieldValueTooLong"
TOO_MANY = "FieldValueTooMany"
TYPE_INVALID = "FieldValueTypeInvalid"
TOO_SHORT = "FieldValueTooShort"
INTERNAL = "InternalError"

_TITLES = {
    NOT_FOUND: "Not found",
    REQUIRED: "Required value",
    DUPLICATE: "Duplicate value",
    INVALID: "Invalid value",
    NOT_SUPPORTED: "Unsupported value",
    FORBIDDEN: "Forbidden",
    TOO_LONG: "Too long",
    TOO_MANY: "Too many",
    INTERNAL: "Internal error",
    TYPE_INVALID: "Invalid value",
    TOO_SHORT: "Too short",
}
_NO_VALUE = {REQUIRED, FORBIDDEN, TOO_LONG, TOO_SHORT, INTERNAL}


def go_float(value: float) -> str:
    """Go's `%v` of a float64: shortest representation, integral values without a decimal point."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    if "e" in text or "E" in text:
        mantissa, exponent = text.lower().split("e")
        exp = int(exponent)
        return f"{mantissa.removesuffix('.0')}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return text


def go_quote(text: str) -> str:
    """Go's `%q` of a string (strconv.Quote), close enough for printable text."""
    return json.dumps(text, ensure_ascii=False)


def go_json(value: Any) -> str:
    """encoding/json of a decoded JSON value: compact, map keys sorted."""
    return (
        json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, default=str)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )


def go_value(value: Any) -> str:
    """How `field.Error.ErrorBody` prints a bad value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, str):
        return go_quote(value)
    return go_json(value)


@dataclass
class FieldError:
    """One `field.Error`: type, path (`spec.storage.location`, `status.conditions[0].type`), value, detail."""

    type: str
    field: str
    value: Any = OMIT
    detail: str = ""

    def body(self) -> str:
        title = _TITLES.get(self.type, f'<unknown error "{self.type}">')
        text = title if self.type in _NO_VALUE or self.value is OMIT else f"{title}: {go_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"

    def cause(self) -> dict[str, Any]:
        return {"reason": self.type, "message": self.body(), "field": self.field}


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(REQUIRED, path, "", detail)


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(INVALID, path, value, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(FORBIDDEN, path, "", detail)


def not_supported(path: str, value: Any, allowed: list[Any]) -> FieldError:
    quoted = [go_quote(item if isinstance(item, str) else go_json(item)) for item in allowed]
    return FieldError(NOT_SUPPORTED, path, value, "supported values: " + ", ".join(quoted) if quoted else "")


def too_long(path: str, max_length: int) -> FieldError:
    detail = (
        f"may not be more than {max_length} {'byte' if max_length == 1 else 'bytes'}"
        if max_length >= 0
        else "value is too long"
    )
    return FieldError(TOO_LONG, path, "<value omitted>", detail)


def too_many(path: str, actual: int, maximum: int) -> FieldError:
    detail = (
        f"must have at most {maximum} {'item' if maximum == 1 else 'items'}" if maximum >= 0 else "has too many items"
    )
    return FieldError(TOO_MANY, path, actual if actual >= 0 else OMIT, detail)


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError(DUPLICATE, path, value)


def type_invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(TYPE_INVALID, path, value, detail)


def aggregate(errors: list[FieldError]) -> str:
    """`ErrorList.ToAggregate().Error()`: one message, or `[a, b]`, repeated messages once."""
    seen: list[str] = []
    for error in errors:
        text = str(error)
        if text not in seen:
            seen.append(text)
    if len(seen) == 1:
        return seen[0]
    return "[" + ", ".join(seen) + "]"


@dataclass
class Path:
    """A field path that renders like `field.Path.String()` (`a.b[0][key]`)."""

    parts: tuple[str, ...] = field(default_factory=tuple)

    def child(self, name: str) -> Path:
        return Path((*self.parts, f".{name}" if self.parts else name))

    def index(self, i: int) -> Path:
        return Path((*self.parts, f"[{i}]"))

    def key(self, k: str) -> Path:
        return Path((*self.parts, f"[{k}]"))

    def __str__(self) -> str:
        return "".join(self.parts) if self.parts else "<nil>"
