"""Checkpoint codec for Workplace sessions: each session as a diff against its pristine base.

* The **base** is the plain encoding of the pristine tables a session was seeded from; it is
  content-addressed (sha256 of its canonical JSON) and written once per checkpoint.
* A **session state** is ``{"schema_version": 2, "base": <digest>, "tables": ...}`` holding per table
  only what differs from the base: changed cells, removed and appended rows (by position), columns
  whose dtype changed, and the index when it changed. A table that differs in shape beyond that
  (reordered rows, other columns) is stored in full.
* :func:`encode_plain` (every table in full, the ~350 KB "known" encoding) is the benchmark baseline.

The diff itself lives in :mod:`.codec_diff`; it is exact even for tables changed behind the tools'
back. Decoding validates strictly (:class:`InvalidSessionState`); encoding rejects values JSON
cannot carry (:class:`UnencodableStateError`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pydantic import ValidationError

from .codec_columns import (
    InvalidSessionState,
    UnencodableStateError,
    decode_table_plain,
    encode_table_plain,
)
from .codec_diff import BaseTable, decode_table_diff, encode_table, is_empty_diff
from .codec_models import FullTableModel, PlainStateModel, SessionStateModel
from .environment import TABLE_KEYS, TABLE_LAYOUT, PristineTables, TableKey, WorkplaceEnvironment

#: 2: rows by position and the index as runs (tables whose labels repeat or were renumbered by an
#: append, as NeMo Gym's tools leave them); 1 (labels) was written before the tools matched NeMo Gym.
SCHEMA_VERSION = 2

__all__ = [
    "SCHEMA_VERSION",
    "InvalidSessionState",
    "UnencodableStateError",
    "base_digest",
    "canonical_json",
    "decode_base",
    "decode_plain",
    "decode_session",
    "encode_base",
    "encode_plain",
    "encode_session",
    "encode_tables",
]


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


# --------------------------------------------------------------------------- bases


@dataclass
class _BaseView:
    digest: str
    encoded: dict[str, Any]
    tables: dict[TableKey, BaseTable]


def _base_view(base: PristineTables) -> _BaseView:
    view = base.cache.get("codec")
    if view is None:
        encoded = _encode_tables_plain(base.tables)
        view = _BaseView(
            digest=hashlib.sha256(canonical_json(encoded)).hexdigest(),
            encoded=encoded,
            tables={key: BaseTable.of(df) for key, df in base.tables.items()},
        )
        base.cache["codec"] = view
    return view


def base_digest(base: PristineTables) -> str:
    return _base_view(base).digest


def encode_base(base: PristineTables) -> dict[str, Any]:
    """The base's plain encoding (shared; treat as read-only, or serialize it)."""
    return _base_view(base).encoded


def decode_base(digest: str, encoded: Mapping[str, Any]) -> PristineTables:
    """Pristine tables from a stored base, after checking the content matches its digest."""
    try:
        actual = hashlib.sha256(canonical_json(encoded)).hexdigest()
    except (TypeError, ValueError) as exc:
        raise InvalidSessionState(f"base {digest[:12]} is not canonical JSON: {exc}") from None
    if actual != digest:
        raise InvalidSessionState(f"base content hashes to {actual[:12]}, not {digest[:12]}")
    base = PristineTables(decode_plain(encoded))
    base.cache["codec"] = _BaseView(
        digest=digest,
        encoded=json.loads(canonical_json(encoded)),
        tables={key: BaseTable.of(df) for key, df in base.tables.items()},
    )
    return base


# --------------------------------------------------------------------------- plain


def _encode_tables_plain(tables: Mapping[TableKey, pd.DataFrame]) -> dict[str, Any]:
    nested: dict[str, dict[str, Any]] = {}
    for (container, attr), df in tables.items():
        nested.setdefault(container, {})[attr] = encode_table_plain(df)
    return {"schema_version": SCHEMA_VERSION, "tables": nested}


def encode_plain(env: WorkplaceEnvironment) -> dict[str, Any]:
    """Every table in full, as columns (the baseline the diff encoding is measured against)."""
    return _encode_tables_plain(dict(env.items()))


def _check_version(state: Any) -> None:
    if not isinstance(state, Mapping):
        raise InvalidSessionState(f"state must be a JSON object, got {type(state).__name__}")
    version = state.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise InvalidSessionState(f"unsupported schema_version {version!r}")


def _check_layout(tables: Mapping[str, Mapping[str, Any]]) -> None:
    if set(tables) != set(TABLE_LAYOUT):
        missing, extra = set(TABLE_LAYOUT) - set(tables), set(tables) - set(TABLE_LAYOUT)
        raise InvalidSessionState(f"containers: missing {sorted(missing)}, extra {sorted(extra)}")
    for container, attrs in TABLE_LAYOUT.items():
        if set(tables[container]) != set(attrs):
            raise InvalidSessionState(f"{container}: tables {sorted(tables[container])}, expected {sorted(attrs)}")


def _validation_error(exc: ValidationError) -> InvalidSessionState:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return InvalidSessionState(f"{exc.error_count()} invalid field(s), first at {where}: {first['msg']}")


def decode_plain(state: Mapping[str, Any]) -> dict[TableKey, pd.DataFrame]:
    _check_version(state)
    try:
        model = PlainStateModel.model_validate(state)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    _check_layout(model.tables)
    out: dict[TableKey, pd.DataFrame] = {}
    for key in TABLE_KEYS:
        try:
            out[key] = decode_table_plain(model.tables[key[0]][key[1]])
        except InvalidSessionState as exc:
            raise InvalidSessionState(f"{key[0]}.{key[1]}: {exc}") from None
    return out


# --------------------------------------------------------------------------- sessions


def encode_session(env: WorkplaceEnvironment) -> dict[str, Any]:
    """The session's state as a diff against its base (JSON-serializable, no live objects)."""
    return encode_tables(dict(env.items()), env.base)


def encode_tables(tables: Mapping[TableKey, pd.DataFrame], base: PristineTables) -> dict[str, Any]:
    """Tables (e.g. a session's capture) as a diff against ``base``; only reads them."""
    view = _base_view(base)
    nested: dict[str, dict[str, Any]] = {}
    for key in TABLE_KEYS:
        nested.setdefault(key[0], {})[key[1]] = encode_table(tables[key], view.tables[key])
    return {"schema_version": SCHEMA_VERSION, "base": view.digest, "tables": nested}


def decode_session(state: object, bases: Mapping[str, PristineTables]) -> WorkplaceEnvironment:
    """Rebuild a session from its state; ``bases`` maps digest -> pristine tables."""
    _check_version(state)
    try:
        model = SessionStateModel.model_validate(state)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    base = bases.get(model.base)
    if base is None:
        raise InvalidSessionState(f"unknown base {model.base[:12]}")
    _check_layout(model.tables)
    view = _base_view(base)
    tables: dict[TableKey, pd.DataFrame] = {}
    for key in TABLE_KEYS:
        table = model.tables[key[0]][key[1]]
        try:
            if not isinstance(table, FullTableModel) and is_empty_diff(table):
                # the pristine object itself, shared until a tool touches it (as a fresh session's tables)
                tables[key] = view.tables[key].df
            elif isinstance(table, FullTableModel):
                tables[key] = decode_table_plain(table.full)
            else:
                tables[key] = decode_table_diff(table, view.tables[key])
        except InvalidSessionState as exc:
            raise InvalidSessionState(f"{key[0]}.{key[1]}: {exc}") from None
        except (ValueError, TypeError, IndexError, OverflowError) as exc:
            raise InvalidSessionState(f"{key[0]}.{key[1]}: {type(exc).__name__}: {exc}") from None
    # every table is shared: the session copies each into its own consolidated frame before its first use
    # (WorkplaceEnvironment._own), whether it is the pristine object or one rebuilt from the diff
    return WorkplaceEnvironment(tables, base, shared=True)
