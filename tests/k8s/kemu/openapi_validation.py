"""Schema validation of custom resources as kube-apiserver does it (kube-openapi's validate package).

kube-apiserver validates a custom resource against its CRD's `openAPIV3Schema` with kube-openapi's
`SchemaValidator` and turns each result into a `field.Error` (apiextensions-apiserver,
pkg/apiserver/validation/validation.go, `kubeOpenAPIResultToFieldErrors`). This module follows the
same structure so the answers match a real server's, message for message:

- per schema node the validators run in kube-openapi's order: type, allOf/oneOf/anyOf/not, string
  (maxLength, minLength, pattern; first failure only), format, number (multipleOf, minimum, maximum),
  array (items, minItems, maxItems, uniqueItems), enum, object (min/maxProperties, additional
  properties, properties, required);
- messages are kube-openapi's (`spec.x in body should be greater than or equal to 1`), mapped to field
  errors as the apiserver maps them: Required, Unsupported value (enum), Too long (maxLength), Too many
  (maxItems, maxProperties), Invalid value with the type message (type), Invalid value otherwise; oneOf,
  anyOf, allOf and not failures are not field-scoped and come out at the path `<nil>`;
- oneOf/anyOf report the failures of the alternative that matched most (kube-openapi's MatchCount);
- formats CRDs may use (`date-time`, `uuid`, `ipv4`, ...) are checked, others are ignored, as the
  apiserver strips unsupported formats;
- patterns match anywhere (Go's `regexp.MatchString`), lengths count characters (runes);
- on update, a value equal to the old one (correlated through object fields and list-type=map keys)
  is not re-validated ("ratcheting", GA since Kubernetes 1.33).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import fielderrors as fe
from .fielderrors import FieldError

IN = "body"

# codes of kube-openapi errors/schema.go
(
    INVALID_TYPE,
    REQUIRED,
    TOO_LONG,
    TOO_SHORT,
    PATTERN,
    ENUM,
    MULTIPLE_OF,
    MAX,
    MIN,
    UNIQUE,
    MAX_ITEMS,
    MIN_ITEMS,
    NO_ADDITIONAL_ITEMS,
    TOO_FEW_PROPERTIES,
    TOO_MANY_PROPERTIES,
    UNALLOWED_PROPERTY,
) = range(600, 616)
COMPOSITE = 422

SUPPORTED_STRING_FORMATS = {
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "k8sshortname",
    "k8slongname",
}


@dataclass
class OAError:
    """A kube-openapi validation error. `name` is its path; `field_scoped` is False for composite errors."""

    code: int
    name: str
    message: str
    value: Any = None
    valid: Any = None
    values: list[Any] | None = None
    field_scoped: bool = True


@dataclass
class Result:
    errors: list[OAError] = field(default_factory=list)
    match_count: int = 0

    def add(self, *errors: OAError) -> None:
        for error in errors:
            if all(error.message != seen.message for seen in self.errors):  # Result.AddErrors keeps them unique
                self.errors.append(error)

    def merge(self, *others: Result | None) -> Result:
        for other in others:
            if other is not None:
                self.add(*other.errors)
                self.match_count += other.match_count
        return self

    def valid(self) -> bool:
        return not self.errors


def _err(error: OAError) -> Result:
    return Result([error])


def _where(name: str) -> str:
    return f"{name} in {IN}"


def _format_num(value: Any) -> str:
    return fe.go_float(value) if isinstance(value, float) else str(value)


def normalized_format(schema: dict[str, Any]) -> str:
    """The format kube-apiserver keeps after StripUnsupportedFormatsPostProcessor."""
    fmt = schema.get("format") or ""
    if not fmt:
        return ""
    kind = schema.get("type") or ""
    if kind in ("", "string"):
        return fmt if fmt.replace("-", "") in SUPPORTED_STRING_FORMATS else ""
    if kind == "integer":
        return fmt if fmt in ("int32", "int64") else ""
    if kind == "number":
        return fmt if fmt in ("float", "double") else ""
    return ""


def json_type(value: Any) -> tuple[str, str]:
    """(type, format) kube-openapi infers for a decoded JSON value."""
    if isinstance(value, bool):
        return "boolean", ""
    if isinstance(value, str):
        return "string", ""
    if isinstance(value, int):
        return "integer", "int64"
    if isinstance(value, float):
        return "number", "float64"
    if isinstance(value, list):
        return "array", ""
    if isinstance(value, dict):
        return "object", ""
    return "", ""


def schema_types(schema: dict[str, Any]) -> list[str]:
    if schema.get("x-kubernetes-int-or-string"):
        return ["integer", "string"]
    kind = schema.get("type")
    return [kind] if kind else []


# ---- formats (kube-openapi strfmt) ----

_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
_DATETIME_TIME = re.compile(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$")
_DURATION = re.compile(r"^([-+]?(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+$|^0$")
_SCALA_DURATION = re.compile(r"^((\d+)\s*([A-Za-zµ]+))+$")
_HOSTNAME = re.compile(
    r"^([a-zA-Z0-9]((-?[a-zA-Z0-9]{0,62})?)|([a-zA-Z0-9](([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)(\.)){1,}"
    r"([a-zA-Z]){2,63})$"
)
_UUIDS = {
    "uuid": re.compile(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"),
    "uuid3": re.compile(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$"),
    "uuid4": re.compile(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"),
    "uuid5": re.compile(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"),
}


def _matches(rx: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda text: bool(rx.match(text))


_MAC = re.compile(r"^([0-9A-Fa-f]{2}[:-]){5}([0-9A-Fa-f]{2})$|^([0-9A-Fa-f]{4}\.){2}[0-9A-Fa-f]{4}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
_HEXCOLOR = re.compile(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")
_RGBCOLOR = re.compile(
    r"^rgb\(\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,"
    r"\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*\)$"
)
_SSN = re.compile(r"^\d{3}[- ]?\d{2}[- ]?\d{4}$")
_K8S_SHORT = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_K8S_LONG = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BSON = re.compile(r"^[0-9a-fA-F]{24}$")


def _is_date(text: str) -> bool:
    if not _DATE.match(text):
        return False
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return True


def is_datetime(text: str) -> bool:
    """strfmt.IsDateTime: a valid date, `t`, then hh:mm:ss[.frac](z|±hh:mm), case-insensitive."""
    if len(text) < 4:
        return False
    parts = text.lower().split("t")
    if len(parts) < 2 or not _is_date(parts[0]):
        return False
    match = _DATETIME_TIME.match(parts[1])
    if not match:
        return False
    return match.group(1) <= "23" and match.group(2) <= "59" and match.group(3) <= "59"


def parse_datetime(text: str) -> datetime.datetime | None:
    try:
        value = datetime.datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def parse_duration(text: str) -> datetime.timedelta | None:
    """Go's time.ParseDuration subset (h, m, s, ms, us, ns)."""
    if text in ("0", "+0", "-0"):
        return datetime.timedelta(0)
    match = re.fullmatch(r"([-+]?)((?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+", text)
    if not match:
        return None
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    total = sum(
        float(number) * units[unit] for number, unit in re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text)
    )
    return datetime.timedelta(seconds=-total if match.group(1) == "-" else total)


def _valid_uri(text: str) -> bool:
    # net/url.ParseRequestURI: an absolute URI or an absolute path, no fragment-only, no spaces
    return (
        bool(text)
        and " " not in text
        and (text.startswith("/") or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", text) is not None)
    )


def _valid_ip(text: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(text).version == version
    except ValueError:
        return False


def _valid_cidr(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return "/" in text


def _valid_isbn(text: str, kind: str) -> bool:
    digits = re.sub(r"[\s-]", "", text)
    ok10 = (
        bool(re.fullmatch(r"\d{9}[\dX]", digits))
        and sum((10 - i) * (10 if c == "X" else int(c)) for i, c in enumerate(digits)) % 11 == 0
    )
    ok13 = (
        bool(re.fullmatch(r"\d{13}", digits))
        and sum((1 if i % 2 == 0 else 3) * int(c) for i, c in enumerate(digits)) % 10 == 0
    )
    return {"isbn10": ok10, "isbn13": ok13}.get(kind, ok10 or ok13)


def _valid_creditcard(text: str) -> bool:
    digits = re.sub(r"\D", "", text)
    return bool(
        re.fullmatch(
            r"(?:4[0-9]{12}(?:[0-9]{3})?|5[1-5][0-9]{14}|6(?:011|5[0-9][0-9])[0-9]{12}|3[47][0-9]{13}|"
            r"3(?:0[0-5]|[68][0-9])[0-9]{11}|(?:2131|1800|35\d{3})\d{11})",
            digits,
        )
    )


def _valid_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except ValueError:
        return False
    return True


def format_ok(fmt: str, text: str) -> bool:
    name = fmt.replace("-", "")
    checks = {
        "datetime": is_datetime,
        "date": _is_date,
        "duration": lambda t: parse_duration(t) is not None or bool(_SCALA_DURATION.match(t)),
        "hostname": lambda t: len(t) <= 255 and bool(_HOSTNAME.match(t)),
        "ipv4": lambda t: _valid_ip(t, 4),
        "ipv6": lambda t: _valid_ip(t, 6),
        "cidr": _valid_cidr,
        "mac": lambda t: bool(_MAC.match(t)),
        "email": lambda t: bool(_EMAIL.match(t)),
        "uri": _valid_uri,
        "byte": _valid_base64,
        "password": lambda t: True,
        "hexcolor": lambda t: bool(_HEXCOLOR.match(t)),
        "rgbcolor": lambda t: bool(_RGBCOLOR.match(t)),
        "ssn": lambda t: bool(_SSN.match(t)),
        "creditcard": _valid_creditcard,
        "isbn": lambda t: _valid_isbn(t, "isbn"),
        "isbn10": lambda t: _valid_isbn(t, "isbn10"),
        "isbn13": lambda t: _valid_isbn(t, "isbn13"),
        "bsonobjectid": lambda t: bool(_BSON.match(t)),
        "k8sshortname": lambda t: len(t) <= 63 and bool(_K8S_SHORT.match(t)),
        "k8slongname": lambda t: len(t) <= 253 and bool(_K8S_LONG.match(t)),
        **{name: _matches(rx) for name, rx in _UUIDS.items()},
    }
    check = checks.get(name)
    return True if check is None else check(text)


_REGEX_CACHE: dict[str, re.Pattern[str] | Exception] = {}


def go_regex(pattern: str) -> re.Pattern[str]:
    """A Go RE2 pattern compiled with Python's `re` (the syntax CRDs use is common to both)."""
    compiled = _REGEX_CACHE.get(pattern)
    if compiled is None:
        try:
            compiled = re.compile(pattern.replace(r"\z", r"\Z"))
        except re.error as exc:
            compiled = exc
        _REGEX_CACHE[pattern] = compiled
    if isinstance(compiled, Exception):
        raise compiled
    return compiled


# ---- the validator ----


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


UNSET = object()


class SchemaValidator:
    """kube-openapi's SchemaValidator over a CRD JSONSchemaProps dict (with ratcheting when `old` is given)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema

    def validate(self, value: Any, old: Any = UNSET) -> list[OAError]:
        return self._validate(self.schema, value, "", old).errors

    # -- one schema node --

    def _validate(self, schema: dict[str, Any], data: Any, path: str, old: Any = UNSET) -> Result:
        result = Result()
        if old is not UNSET and _json_equal(data, old):
            result.match_count += 1
            return result  # ratcheting: an unchanged value keeps passing
        if data is None:
            result.merge(self._type(schema, None, path))
            result.merge(self._enum(schema, None, path))
            return result
        steps: list[Any] = []
        if schema_types(schema) or normalized_format(schema):
            steps.append(lambda: self._type(schema, data, path))
        steps.append(lambda: self._props(schema, data, path, old))
        if isinstance(data, str):
            steps.append(lambda: self._string(schema, data, path))
            if normalized_format(schema):
                steps.append(lambda: self._format(schema, data, path))
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            steps.append(lambda: self._number(schema, data, path))
        if isinstance(data, list):
            steps.append(lambda: self._array(schema, data, path, old))
        steps.append(lambda: self._enum(schema, data, path))
        if isinstance(data, dict):
            steps.append(lambda: self._object(schema, data, path, old))
        for step in steps:
            result.merge(step())
            result.match_count += 1
        result.match_count += 1
        return result

    def _type(self, schema: dict[str, Any], data: Any, path: str) -> Result:
        types = schema_types(schema)
        fmt = normalized_format(schema)
        if data is None:
            if types and "null" not in types and not schema.get("nullable"):
                return _err(self._invalid_type(path, ",".join(types), "null"))
            return Result(match_count=1)
        kind, value_format = json_type(data)
        is_float_int = kind == "number" and float(data).is_integer() and "integer" in types
        is_int_float = kind == "integer" and "number" in types
        is_lower_int = fmt == "int64" and value_format == "int32"
        if (
            not isinstance(data, (str, list))
            and fmt
            and not (kind in types or value_format == fmt or is_float_int or is_int_float or is_lower_int)
        ):
            return _err(self._invalid_type(path, fmt, value_format))
        if not ("number" in types or "integer" in types) and fmt and isinstance(data, (str, list)):
            return Result(match_count=1)
        if not (kind in types or is_float_int or is_int_float):
            return _err(self._invalid_type(path, ",".join(types), kind))
        return Result(match_count=1)

    @staticmethod
    def _invalid_type(path: str, type_name: str, value: Any) -> OAError:
        if isinstance(value, str):
            message = f"{_where(path)} must be of type {type_name}: {fe.go_quote(value)}"
        else:
            message = f"{_where(path)} must be of type {type_name}"
        return OAError(INVALID_TYPE, path, message, value=value)

    def _props(self, schema: dict[str, Any], data: Any, path: str, old: Any) -> Result:
        main = Result()
        any_of = schema.get("anyOf") or []
        if any_of:
            best: Result | None = None
            first_success: Result | None = None
            succeeded = False
            for sub in any_of:
                result = self._validate(sub, data, path)
                if result.valid():
                    best, succeeded = None, True
                    first_success = first_success or result
                    break
                if best is None or result.match_count > best.match_count:
                    best = result
            if not succeeded:
                main.add(
                    OAError(COMPOSITE, path, f'"{path}" must validate at least one schema (anyOf)', field_scoped=False)
                )
            main.merge(best if best is not None else first_success)
        one_of = schema.get("oneOf") or []
        if one_of:
            best = None
            first_success = None
            validated = 0
            for sub in one_of:
                result = self._validate(sub, data, path)
                if result.valid():
                    validated += 1
                    best = None
                    first_success = first_success or result
                    continue
                if validated == 0 and (best is None or result.match_count > best.match_count):
                    best = result
            if validated != 1:
                more = "Found none valid" if validated == 0 else f"Found {validated} valid alternatives"
                main.add(
                    OAError(
                        COMPOSITE,
                        path,
                        f'"{path}" must validate one and only one schema (oneOf). {more}',
                        field_scoped=False,
                    )
                )
                main.merge(best)
            else:
                main.merge(first_success)
        all_of = schema.get("allOf") or []
        if all_of:
            validated = 0
            for sub in all_of:
                result = self._validate(sub, data, path)
                if result.valid():
                    validated += 1
                main.merge(result)
            if validated != len(all_of):
                more = ". None validated" if validated == 0 else ""
                main.add(
                    OAError(
                        COMPOSITE, path, f'"{path}" must validate all the schemas (allOf){more}', field_scoped=False
                    )
                )
        if schema.get("not") is not None and self._validate(schema["not"], data, path).valid():
            main.add(OAError(COMPOSITE, path, f'"{path}" must not validate the schema (not)', field_scoped=False))
        main.match_count += 1
        return main

    @staticmethod
    def _string(schema: dict[str, Any], data: str, path: str) -> Result | None:
        length = len(data)
        if schema.get("maxLength") is not None and length > schema["maxLength"]:
            return _err(
                OAError(
                    TOO_LONG,
                    path,
                    f"{_where(path)} should be at most {schema['maxLength']} chars long",
                    value=data,
                    valid=schema["maxLength"],
                )
            )
        if schema.get("minLength") is not None and length < schema["minLength"]:
            return _err(
                OAError(
                    TOO_SHORT,
                    path,
                    f"{_where(path)} should be at least {schema['minLength']} chars long",
                    value=data,
                    valid=schema["minLength"],
                )
            )
        pattern = schema.get("pattern")
        if pattern:
            try:
                matched = go_regex(pattern).search(data) is not None
                shown = pattern
            except re.error as exc:
                matched, shown = False, f"{pattern}, but pattern is invalid: {exc}"
            if not matched:
                return _err(OAError(PATTERN, path, f"{_where(path)} should match '{shown}'", value=data))
        return None

    @staticmethod
    def _format(schema: dict[str, Any], data: str, path: str) -> Result | None:
        fmt = normalized_format(schema)
        if format_ok(fmt, data):
            return None
        return _err(SchemaValidator._invalid_type(path, fmt, data))

    @staticmethod
    def _number(schema: dict[str, Any], data: int | float, path: str) -> Result:
        res = Result()
        kind = schema.get("type") or ""
        fmt = normalized_format(schema)
        if kind == "integer" and fmt == "int32" and isinstance(data, int) and not -(2**31) <= data < 2**31:
            res.add(
                OAError(
                    COMPOSITE,
                    path,
                    f"Checked value must be of type integer with format int32 in {path}",
                    field_scoped=False,
                )
            )
        factor = schema.get("multipleOf")
        if factor is not None:
            if factor <= 0:
                res.add(
                    OAError(
                        MULTIPLE_OF,
                        path,
                        f"factor MultipleOf declared for {path} must be positive: {_format_num(factor)}",
                        value=factor,
                    )
                )
            else:
                quotient = data / factor
                if not float(quotient).is_integer():
                    shown = int(factor) if isinstance(data, int) and float(factor).is_integer() else factor
                    res.add(
                        OAError(
                            MULTIPLE_OF,
                            path,
                            f"{_where(path)} should be a multiple of {_format_num(shown)}",
                            value=data,
                        )
                    )
        minimum, maximum = schema.get("minimum"), schema.get("maximum")
        if minimum is not None:
            exclusive = bool(schema.get("exclusiveMinimum"))
            bound = int(minimum) if isinstance(data, int) else float(minimum)
            if (not exclusive and data < bound) or (exclusive and data <= bound):
                word = "greater than" if exclusive else "greater than or equal to"
                res.add(OAError(MIN, path, f"{_where(path)} should be {word} {_format_num(bound)}", value=data))
        if maximum is not None:
            exclusive = bool(schema.get("exclusiveMaximum"))
            bound = int(maximum) if isinstance(data, int) else float(maximum)
            if (not exclusive and data > bound) or (exclusive and data >= bound):
                word = "less than" if exclusive else "less than or equal to"
                res.add(OAError(MAX, path, f"{_where(path)} should be {word} {_format_num(bound)}", value=data))
        res.match_count += 1
        return res

    def _array(self, schema: dict[str, Any], data: list[Any], path: str, old: Any) -> Result:
        result = Result()
        items = schema.get("items")
        if isinstance(items, dict):
            old_items = correlate_list(schema, data, old)
            for i, item in enumerate(data):
                result.merge(self._validate(items, item, f"{path}[{i}]", old_items[i]))
        size = len(data)
        if schema.get("minItems") is not None and size < schema["minItems"]:
            result.add(
                OAError(
                    MIN_ITEMS,
                    path,
                    f"{_where(path)} should have at least {schema['minItems']} items",
                    value=size,
                    valid=schema["minItems"],
                )
            )
        if schema.get("maxItems") is not None and size > schema["maxItems"]:
            result.add(
                OAError(
                    MAX_ITEMS,
                    path,
                    f"{_where(path)} should have at most {schema['maxItems']} items",
                    value=size,
                    valid=schema["maxItems"],
                )
            )
        if schema.get("uniqueItems"):
            seen: list[Any] = []
            for item in data:
                if any(_json_equal(item, other) for other in seen):
                    result.add(OAError(UNIQUE, path, f"{_where(path)} shouldn't contain duplicates"))
                    break
                seen.append(item)
        result.match_count += 1
        return result

    @staticmethod
    def _enum(schema: dict[str, Any], data: Any, path: str) -> Result | None:
        enum = schema.get("enum")
        if not enum:
            return None
        for allowed in enum:
            if _json_equal(data, allowed) or (
                isinstance(allowed, float)
                and isinstance(data, int)
                and not isinstance(data, bool)
                and float(data) == allowed
            ):
                return None
        return _err(OAError(ENUM, path, f"{_where(path)} should be one of {enum}", value=data, values=list(enum)))

    def _object(self, schema: dict[str, Any], data: dict[str, Any], path: str, old: Any) -> Result:
        res = Result()
        count = len(data)
        if schema.get("minProperties") is not None and count < schema["minProperties"]:
            res.add(
                OAError(
                    TOO_FEW_PROPERTIES,
                    path,
                    f"{_where(path)} should have at least {schema['minProperties']} properties",
                    value=count,
                    valid=schema["minProperties"],
                )
            )
        if schema.get("maxProperties") is not None and count > schema["maxProperties"]:
            res.add(
                OAError(
                    TOO_MANY_PROPERTIES,
                    path,
                    f"{_where(path)} should have at most {schema['maxProperties']} properties",
                    value=count,
                    valid=schema["maxProperties"],
                )
            )
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        old_map = old if isinstance(old, dict) else {}
        if additional is False:
            for key in data:
                if key not in properties:
                    res.add(
                        OAError(UNALLOWED_PROPERTY, path, f"{path}.{key} in {IN} is a forbidden property", value=key)
                    )
        elif isinstance(additional, dict):
            for key, value in data.items():
                if key not in properties:
                    res.merge(
                        self._validate(
                            additional, value, f"{path}.{key}", old_map.get(key, UNSET) if old is not UNSET else UNSET
                        )
                    )
        for name, sub in properties.items():
            if name in data:
                child = f"{path}.{name}" if path else name
                res.merge(
                    self._validate(sub, data[name], child, old_map.get(name, UNSET) if old is not UNSET else UNSET)
                )
        for name in schema.get("required") or []:
            if name not in data:
                res.add(OAError(REQUIRED, f"{path}.{name}", f"{_where(f'{path}.{name}')} is required"))
        return res


def correlate_list(schema: dict[str, Any], data: list[Any], old: Any) -> list[Any]:
    """The old value of each item, for list-type=map lists (by their keys); UNSET otherwise."""
    if old is UNSET or not isinstance(old, list) or schema.get("x-kubernetes-list-type") != "map":
        return [UNSET] * len(data)
    keys = schema.get("x-kubernetes-list-map-keys") or []

    def key_of(item: Any) -> Any:
        return tuple(repr(item.get(k)) for k in keys) if isinstance(item, dict) else None

    by_key = {key_of(item): item for item in old if isinstance(item, dict)}
    return [by_key.get(key_of(item), UNSET) if isinstance(item, dict) else UNSET for item in data]


def to_field_errors(errors: list[OAError], prefix: str | None = None) -> list[FieldError]:
    """apiextensions-apiserver's kubeOpenAPIResultToFieldErrors."""
    out: list[FieldError] = []
    for error in errors:
        if not error.field_scoped:
            out.append(fe.invalid(prefix or "<nil>", "", error.message))
            continue
        name = error.name
        path = prefix or ""
        if name and name != ".":
            name = name.removeprefix(".")
            path = f"{path}.{name}" if path else name
        path = path or "<nil>"
        value = "" if error.value is None else error.value
        if error.code == REQUIRED:
            out.append(fe.required(path))
        elif error.code == ENUM:
            out.append(fe.not_supported(path, error.value, error.values or []))
        elif error.code == TOO_LONG:
            out.append(fe.too_long(path, error.valid if isinstance(error.valid, int) else -1))
        elif error.code in (MAX_ITEMS, TOO_MANY_PROPERTIES):
            out.append(
                fe.too_many(
                    path,
                    error.value if isinstance(error.value, int) else -1,
                    error.valid if isinstance(error.valid, int) else -1,
                )
            )
        elif error.code == INVALID_TYPE:
            out.append(fe.type_invalid(path, value, error.message))
        else:
            out.append(fe.invalid(path, value, error.message))
    return out
