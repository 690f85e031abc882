"""One session's Workplace Assistant tool environment: seven pandas tables.

The tables are read from the vendored CSVs exactly as NeMo Gym's tools read them (``dtype=str`` with
pandas 2.3, so ``object`` columns where an empty cell is NaN and a value a tool stores as ``None``
stays ``None``), once per process; every session starts on the very pristine DataFrames and gets its
own copy of a table the first time a tool touches it (:class:`WorkplaceEnvironment`): one 2-D block per
dtype, the cells shared by reference with the pristine table.

Copy-on-write is switched on for this process (pandas 2.3 makes it opt-in; only this server uses
pandas), so no write reaches the pristine table, a checkpoint's capture or another session. The session's
copy references nothing, so a tool's write takes pandas' in-place path, as in NeMo Gym's tables (a write
into a shallow copy would go through copy-on-write's block split and store a list differently). The codec
tells unchanged cells by identity with the pristine cell objects. No tool behaves differently: the
conformance suite (``tests/conformance/test_workplace_assistant.py``) compares every answer and table
with NeMo Gym's modules running without copy-on-write.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

pd.set_option("mode.copy_on_write", True)

DATA_DIR = Path(__file__).resolve().parent / "data"
CSV_DIR = DATA_DIR / "csv_data"

#: The "current time" tools use (the tasks' system prompt fixes today to Thursday 2023-11-30 23:59).
CURRENT_TIME = "2023-11-30 23:59:00"

#: container -> table attributes, in a fixed order (the real server's tool objects and attributes).
TABLE_LAYOUT: dict[str, tuple[str, ...]] = {
    "company_directory": ("_emails",),
    "email": ("_emails",),
    "calendar": ("_calendar_events",),
    "analytics": ("_analytics_data", "_plots_data"),
    "project_management": ("_project_tasks",),
    "customer_relationship_manager": ("_crm_data",),
}

TableKey = tuple[str, str]
TABLE_KEYS: tuple[TableKey, ...] = tuple(
    (container, attr) for container, attrs in TABLE_LAYOUT.items() for attr in attrs
)

# Table keys the tools use, named for readability.
DIRECTORY: TableKey = ("company_directory", "_emails")
EMAILS: TableKey = ("email", "_emails")
CALENDAR: TableKey = ("calendar", "_calendar_events")
ANALYTICS: TableKey = ("analytics", "_analytics_data")
PLOTS: TableKey = ("analytics", "_plots_data")
TASKS: TableKey = ("project_management", "_project_tasks")
CRM: TableKey = ("customer_relationship_manager", "_crm_data")

_PROCESSED_CSV: dict[TableKey, str] = {
    EMAILS: "processed/emails.csv",
    CALENDAR: "processed/calendar_events.csv",
    ANALYTICS: "processed/analytics_data.csv",
    TASKS: "processed/project_tasks.csv",
    CRM: "processed/customer_relationship_manager_data.csv",
}


def _read_str_csv(path: Path, **kwargs: Any) -> pd.DataFrame:
    """Read like NeMo Gym's tools: every cell a string, empty cells NaN (``object`` columns)."""
    return pd.read_csv(path, dtype=str, **kwargs)


def load_tables_from_csv(csv_dir: Path = CSV_DIR) -> dict[TableKey, pd.DataFrame]:
    """Read all seven tables from disk (called once per process via :func:`pristine_tables`)."""
    tables: dict[TableKey, pd.DataFrame] = {
        DIRECTORY: _read_str_csv(csv_dir / "raw/email_addresses.csv", header=None, names=["email_address"]),
    }
    for key, rel in _PROCESSED_CSV.items():
        tables[key] = _read_str_csv(csv_dir / rel)
    analytics = tables[ANALYTICS]
    analytics["user_engaged"] = analytics["user_engaged"] == "True"
    tables[PLOTS] = pd.DataFrame(columns=["file_path"])  # no plots yet
    return {key: tables[key] for key in TABLE_KEYS}


@dataclass(eq=False)
class PristineTables:
    """Tables a session is seeded from. Never mutated; ``cache`` holds data derived by the codec."""

    tables: dict[TableKey, pd.DataFrame]
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if tuple(self.tables) != TABLE_KEYS:
            raise ValueError(f"pristine tables must be exactly {TABLE_KEYS}")


@lru_cache(maxsize=1)
def pristine_tables() -> PristineTables:
    """The process-wide pristine tables, read from the vendored CSVs on first use only."""
    return PristineTables(load_tables_from_csv())


#: change tokens: a session's token changes whenever its tables may have changed (process-wide, never reused)
_tokens = itertools.count(1)
#: guards every environment's table map while a table is handed out (tool calls run in worker threads)
_lock = threading.Lock()
_ALL_KEYS = frozenset(TABLE_KEYS)


class WorkplaceEnvironment:
    """One session's tables. Tools read and replace tables through :meth:`get` / :meth:`put`.

    Tables may be *shared*: the very DataFrame objects of the pristine base (a fresh session), of a
    restored checkpoint, or of a checkpoint's capture (:meth:`capture`). A shared table is replaced by
    a copy (one consolidated block per dtype, cells shared by reference) the first time it is handed
    out, so a tool's in-place write (``df.loc[...] = ...``) lands on the session's own object, never
    on the base or on a capture, and stores values as NeMo Gym's tables store them. Capturing is
    therefore O(1) per session: nothing is copied under the pause.

    :attr:`token` changes whenever the tables may have changed since the last :meth:`capture` (any
    access after it counts), so an unchanged session's encoding from an earlier checkpoint can be
    reused without encoding it again.
    """

    __slots__ = ("_captured", "_shared", "_tables", "_token", "base")

    def __init__(
        self, tables: dict[TableKey, pd.DataFrame], base: PristineTables, *, shared: bool | frozenset[TableKey] = False
    ) -> None:
        """``shared``: every table (True) or these tables are shared objects, copied before the first write."""
        if tuple(tables) != TABLE_KEYS:
            raise ValueError(f"environment tables must be exactly {TABLE_KEYS}")
        self._tables = tables
        #: The pristine tables this session was seeded from (the codec diffs against them).
        self.base = base
        self._shared: frozenset[TableKey] = _ALL_KEYS if shared is True else frozenset(shared or ())
        self._token = next(_tokens)
        self._captured = False

    @classmethod
    def fresh(cls, base: PristineTables | None = None) -> WorkplaceEnvironment:
        """A new session over the pristine tables (shared until a tool first touches each one)."""
        base = base if base is not None else pristine_tables()
        return cls(dict(base.tables), base, shared=True)

    @property
    def token(self) -> int:
        return self._token

    def _own(self, key: TableKey) -> pd.DataFrame:
        """The session's own object for ``key`` (call with :data:`_lock` held)."""
        if self._captured:
            self._captured = False
            self._token = next(_tokens)
        df = self._tables[key]
        if key in self._shared:
            # a full copy, not a shallow one: the session's own frame holds its columns in one 2-D block per
            # dtype and references nothing, as NeMo Gym's tables do (read without copy-on-write). A write into
            # a shallow copy goes through pandas' copy-on-write path, which splits the block and stores some
            # values differently (a list ``[[1]]`` written into a cell becomes ``1.0`` instead of ``[1]``; ``[1, 2]``
            # fails with another message). Cells are copied as references, so the codec's "same object as the
            # base" test still holds for every cell a tool did not write.
            df = self._tables[key] = df.copy(deep=True)
            self._shared = self._shared - {key}
        return df

    def get(self, key: TableKey) -> pd.DataFrame:
        with _lock:
            return self._own(key)

    def put(self, key: TableKey, df: pd.DataFrame) -> None:
        if key not in self._tables:
            raise KeyError(key)
        with _lock:
            self._own(key)
            self._tables[key] = df

    def items(self) -> Iterator[tuple[TableKey, pd.DataFrame]]:
        with _lock:
            return iter([(key, self._own(key)) for key in TABLE_KEYS])

    def capture(self) -> tuple[int, dict[TableKey, pd.DataFrame]]:
        """(change token, the tables as they are now), frozen: they are never written again.

        Called under a checkpoint's pause (no tool runs); every table becomes shared, so the
        session's next access copies before it can write.
        """
        with _lock:
            self._shared = _ALL_KEYS
            self._captured = True
            return self._token, dict(self._tables)
