"""Per-table diff against a pristine base table (used by :mod:`.codec`).

A session's table is some base rows in base order (the kept rows, possibly with changed cells)
followed by appended rows. A diff lists removed base rows by position, changed cells by position,
appended rows, columns whose dtype changed, and the index when it is not the base's (as a range or
as runs of consecutive labels: NeMo Gym's tools renumber on some appends and repeat labels on
others). Anything else (reordered rows, other columns, most cells changed) is stored in full.

Which session row is which base row is found through a key column, a base column holding a distinct
object in every row (the ID columns): a kept row still holds the base's very key object. Rows whose
key changed are placed in the gap their neighbours leave. The choice only affects size: any
alignment encodes the table exactly, since every kept cell is compared with the base row it is
aligned with.

Unchanged columns are found cheaply and soundly: under pandas copy-on-write a session column that
still is the base column's buffer cannot differ from it, and a cell that still holds the base's very
object (compared by pointer, vectorized) cannot differ either. Only the remaining cells are compared
by type and value, with NaN kept apart from ``None`` and -0.0 apart from 0.0.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .codec_columns import (
    InvalidSessionState,
    decode_column,
    decode_values,
    dtype_name,
    encode_table_plain,
    encode_values,
    frame_from_blocks,
    iter_column_arrays,
    pandas_dtype,
    to_pandas_array,
)
from .codec_models import CellsModel, DiffTableModel, RangeShapeModel

#: Above this share of changed cells a table is stored in full rather than as a diff.
FULL_TABLE_SHARE = 0.5
_type_of = np.frompyfunc(type, 1, 1)
_FLOAT = np.array(float, dtype=object)  # compared with an array of types, cell by cell


def _buffer_id(arr: np.ndarray) -> tuple[int, tuple[int, ...], tuple[int, ...], str]:
    return (arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.dtype.str)


@dataclass
class BaseTable:
    """A pristine table plus what the diff needs, computed once per base."""

    df: pd.DataFrame
    diffable: bool
    kinds: list[str]
    arrays: list[np.ndarray]
    buffers: list[tuple[Any, ...]]
    nan_masks: list[np.ndarray | None]
    types: list[np.ndarray | None]
    slots: list[np.ndarray | None]
    #: the key column (distinct objects in every row), its slots sorted and their row positions
    key: int | None = None
    key_sorted: np.ndarray | None = None
    key_rows: np.ndarray | None = None

    @classmethod
    def of(cls, df: pd.DataFrame) -> BaseTable:
        columns = list(iter_column_arrays(df))
        kinds = [dtype_name(dtype) for _, dtype, _ in columns]
        arrays = [arr for _, _, arr in columns]
        nan_masks: list[np.ndarray | None] = []
        types: list[np.ndarray | None] = []
        for arr, kind in zip(arrays, kinds, strict=True):
            if kind in ("object", "str"):
                nan_masks.append(np.array([type(v) is float and v != v for v in arr], dtype=bool))
                types.append(_type_of(arr) if len(arr) else np.empty(0, dtype=object))
            else:
                nan_masks.append(np.isnan(arr) if kind == "float64" else None)
                types.append(None)
        names = list(df.columns)
        diffable = (
            df.index.dtype == np.dtype("int64")
            and type(df.index) in (pd.RangeIndex, pd.Index)
            and all(type(c) is str for c in names)
            and len(set(names)) == len(names)
        )
        slots = [_slots(a) if a.dtype == object else None for a in arrays]
        key = key_sorted = key_rows = None
        for i, sl in enumerate(slots):
            if sl is not None and len(sl) and len(np.unique(sl)) == len(sl):
                key, key_rows = i, np.argsort(sl, kind="stable")
                key_sorted = sl[key_rows]
                break
        return cls(
            df=df,
            diffable=bool(diffable),
            kinds=kinds,
            arrays=arrays,
            buffers=[_buffer_id(a) for a in arrays],
            nan_masks=nan_masks,
            types=types,
            slots=slots,
            key=key,
            key_sorted=key_sorted,
            key_rows=key_rows,
        )


def _index_identical(a: pd.Index, b: pd.Index) -> bool:
    if type(a) is not type(b) or a.dtype != b.dtype or a.name != b.name:
        return False
    if isinstance(a, pd.RangeIndex):
        return (a.start, a.stop, a.step) == (b.start, b.stop, b.step)
    return bool(a.equals(b))


def _index_shape(index: pd.Index) -> dict[str, Any]:
    if isinstance(index, pd.RangeIndex):
        return {"kind": "range", "start": index.start, "stop": index.stop, "step": index.step}
    labels = index.to_numpy()
    if not len(labels):
        return {"kind": "runs", "runs": []}
    starts = np.concatenate([[0], np.flatnonzero(np.diff(labels) != 1) + 1])
    lengths = np.diff(np.concatenate([starts, [len(labels)]]))
    return {"kind": "runs", "runs": [[int(labels[a]), int(n)] for a, n in zip(starts, lengths, strict=True)]}


#: kept rows when no base row was removed (every one, in order)
_ALL_ROWS = np.empty(0, dtype=np.intp)


def is_empty_diff(model: DiffTableModel) -> bool:
    """The table is its base's, unchanged (field by field: a model's ``==`` cost a tenth of decoding a session)."""
    return (
        model.index is None and not model.removed and model.appended is None and not model.cells and not model.retyped
    )


class _StoreFull(Exception):
    """Internal: the table is not a simple diff of its base; store it whole."""


class _SlotView:
    """Exposes an object array's pointer slots as integers through the numpy array interface, so
    cell identity (same object => same value and type) can be tested without touching objects."""

    def __init__(self, arr: np.ndarray) -> None:
        self._arr = arr  # keeps the objects (and the buffer) alive while the view is used
        self.__array_interface__ = {
            "version": 3,
            "shape": arr.shape,
            "strides": arr.strides,
            "typestr": np.dtype(np.intp).str,
            "data": (arr.__array_interface__["data"][0], True),
        }


def _slots(arr: np.ndarray) -> np.ndarray:
    assert arr.dtype == object and arr.ndim == 1
    return np.asarray(_SlotView(arr))


def _same_cell(x: Any, y: Any) -> bool:
    """Exact cell equality: same type, same value, NaN equal to NaN, -0.0 apart from 0.0."""
    if type(x) is not type(y):
        return False
    if type(x) is float:
        if x != x:
            nan: bool = y != y
            return nan
        return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)
    try:
        return bool(x == y)
    except Exception as exc:
        raise _StoreFull from exc


def _changed_objects(t: np.ndarray, bt: BaseTable, i: int, kept: np.ndarray | None) -> np.ndarray:
    """Changed cells of an object column. Cells still holding the base's very object are
    unchanged; only the others are compared, one by one when few, vectorized when many."""
    slots = bt.slots[i]
    assert slots is not None  # an object column has its slots
    base_slots = slots if kept is None else slots[kept]
    changed: np.ndarray = _slots(t) != base_slots
    suspects = np.flatnonzero(changed)
    base = bt.arrays[i]
    if len(suspects) <= 64 or len(suspects) * 8 <= len(t):
        for p in suspects:
            if _same_cell(t[p], base[p if kept is None else kept[p]]):
                changed[p] = False
        return changed
    b = base if kept is None else base[kept]
    base_types, b_nan = bt.types[i], bt.nan_masks[i]
    assert base_types is not None and b_nan is not None
    if kept is not None:
        base_types, b_nan = base_types[kept], b_nan[kept]
    try:
        diff: np.ndarray = np.asarray(t != b, dtype=bool) | np.asarray(_type_of(t) != base_types, dtype=bool)
    except Exception as exc:
        raise _StoreFull from exc
    # Same-typed equal floats may still differ in sign (-0.0); NaN in the base needs a NaN.
    recheck = np.flatnonzero((diff & b_nan) | (~diff & (base_types == _FLOAT)))
    for p in recheck:
        diff[p] = not _same_cell(t[p], b[p])
    return diff


def _changed(t: np.ndarray, kind: str, bt: BaseTable, i: int, kept: np.ndarray | None) -> np.ndarray:
    """Mask of cells of ``t`` that differ from the base column (rows ``kept``, or all) in value,
    type, sign of zero, or NaN-vs-None."""
    if kind in ("object", "str"):
        return _changed_objects(t, bt, i, kept)
    b = bt.arrays[i] if kept is None else bt.arrays[i][kept]
    if kind in ("bool", "int64"):
        return np.asarray(t != b, dtype=bool)
    b_nan = bt.nan_masks[i]
    assert b_nan is not None
    if kept is not None:
        b_nan = b_nan[kept]
    tn = np.isnan(t)
    diff = (t != b) & ~(tn & b_nan)
    changed: np.ndarray = diff | (tn != b_nan) | (np.signbit(t) != np.signbit(b))
    return changed


def _base_then_new(slots: np.ndarray, base_slots: np.ndarray, key_sorted: np.ndarray) -> bool:
    """Whether a table's first rows hold the base's key objects in base order and its later rows (if any) none of
    them: every base row kept, rows only appended. The general search would align it the same way (each base row
    with itself; the rest appended), so the diff is the same, found without sorting or searching every row."""
    n_base = len(base_slots)
    if len(slots) < n_base or not np.array_equal(slots[:n_base], base_slots):
        return False
    extra = slots[n_base:]
    if not len(extra):
        return True
    at = np.minimum(np.searchsorted(key_sorted, extra), n_base - 1)
    return not bool((key_sorted[at] == extra).any())


def _align(arrays: list[np.ndarray], kinds: list[str], bt: BaseTable, n_rows: int) -> tuple[np.ndarray | None, int]:
    """(base position of each kept session row, or None when the rows are the base's; number of
    kept rows). Rows after the kept ones are appended rows."""
    n_base = len(bt.df.index)
    k = bt.key
    if (
        k is None
        or kinds[k] not in ("object", "str")  # both are arrays of object pointers (pandas' python-backed strings too)
        or arrays[k].dtype != object
        or bt.key_sorted is None
        or bt.key_rows is None
    ):
        if n_rows >= n_base:  # no key: rows by position, every base row kept
            return None, n_base
        return np.arange(n_rows), n_rows
    slots = _slots(arrays[k])
    base_slots = bt.slots[k]
    if base_slots is not None and _base_then_new(slots, base_slots, bt.key_sorted):
        return None, n_base  # the base's rows in order, then appended ones (the usual append): nothing to search
    at = np.minimum(np.searchsorted(bt.key_sorted, slots), n_base - 1)
    pos = np.where(bt.key_sorted[at] == slots, bt.key_rows[at], -1)
    matched = np.flatnonzero(pos >= 0)
    if not len(matched):
        return np.empty(0, dtype=np.intp), 0
    if (np.diff(pos[matched]) <= 0).any():
        raise _StoreFull  # rows reordered
    n_kept = int(matched[-1]) + 1
    kept = pos[:n_kept].astype(np.intp)
    holes = np.flatnonzero(kept < 0)
    if len(holes):  # rows whose key object changed: into the gap their neighbours leave
        run_starts = holes[np.concatenate([[True], np.diff(holes) != 1])]
        for start in run_starts:
            end = start
            while end < n_kept and kept[end] < 0:
                end += 1
            before = kept[start - 1] if start else -1
            if end - start > kept[end] - before - 1:
                raise _StoreFull
            kept[start:end] = np.arange(before + 1, before + 1 + (end - start))
    return kept, n_kept


def _encode_table_diff(df: pd.DataFrame, bt: BaseTable) -> dict[str, Any]:
    base = bt.df
    if df is base and bt.diffable:
        return {}  # a table the session never touched is the pristine object itself (WorkplaceEnvironment)
    if not bt.diffable or not _index_identical(df.columns, base.columns):
        raise _StoreFull
    index = df.index
    if (
        index.name != base.index.name
        or index.dtype != np.dtype("int64")
        or type(index) not in (pd.RangeIndex, pd.Index)
    ):
        raise _StoreFull
    columns = list(iter_column_arrays(df))
    kinds = [dtype_name(dtype) for _, dtype, _ in columns]
    arrays = [arr for _, _, arr in columns]
    n_rows = len(index)
    kept, n_kept = _align(arrays, kinds, bt, n_rows)
    out: dict[str, Any] = {}
    if kept is not None:
        removed = np.setdiff1d(np.arange(len(base.index)), kept, assume_unique=True)
        if len(removed):
            out["removed"] = removed.tolist()
    if kept is not None or not _index_identical(index, base.index):
        out["index"] = _index_shape(index)
    cells: dict[str, Any] = {}
    retyped: dict[str, Any] = {}
    appended: dict[str, Any] = {}
    changed_cells = 0
    for i, ((name, _, arr), kind) in enumerate(zip(columns, kinds, strict=True)):
        if kind != bt.kinds[i]:
            retyped[name] = {"dtype": kind, **encode_values(arr, kind)}
            changed_cells += n_rows
            continue
        if n_kept < n_rows:
            appended[name] = encode_values(arr[n_kept:], kind)
        if kept is None and _buffer_id(arr) == bt.buffers[i]:
            continue  # still the base's buffer (copy-on-write): cannot differ
        head = arr[:n_kept] if n_kept < n_rows else arr
        if not len(head):
            continue
        mask = _changed(head, kind, bt, i, kept)
        hits = np.flatnonzero(mask)
        if len(hits):
            cells[name] = {"rows": hits.tolist(), **encode_values(head[hits], kind)}
            changed_cells += len(hits)
    if n_kept < n_rows:
        out["appended"] = {"count": n_rows - n_kept, "data": appended}
        changed_cells += (n_rows - n_kept) * df.shape[1]
    if cells:
        out["cells"] = cells
    if retyped:
        out["retyped"] = retyped
    if changed_cells > FULL_TABLE_SHARE * max(1, n_rows * df.shape[1]):
        raise _StoreFull
    return out


def encode_table(df: pd.DataFrame, bt: BaseTable) -> dict[str, Any]:
    """``df`` as a diff against ``bt``, or ``{"full": ...}`` when it is not a simple diff."""
    try:
        return _encode_table_diff(df, bt)
    except _StoreFull:
        return {"full": encode_table_plain(df)}


def _unique_positions(positions: list[int], size: int, what: str) -> np.ndarray:
    pos = np.asarray(positions, dtype=np.int64)
    if len(np.unique(pos)) != len(pos):
        raise InvalidSessionState(f"{what}: duplicate row positions")
    if len(pos) and (pos.min() < 0 or pos.max() >= size):
        raise InvalidSessionState(f"{what}: row position out of range 0..{size - 1}")
    return pos


def _decoded_index(model: DiffTableModel, bt: BaseTable) -> tuple[pd.Index, np.ndarray | None]:
    """(index of the restored table, kept base positions or None if all rows are the base's)."""
    base_index = bt.df.index
    n_base = len(base_index)
    n_new = model.appended.count if model.appended is not None else 0
    if model.appended is not None and n_new < 1:
        raise InvalidSessionState("appended holds no rows")
    if not model.removed and not n_new:
        kept = None
        n_rows = n_base
    elif not model.removed:
        kept = _ALL_ROWS  # rows appended after every base row
        n_rows = n_base + n_new
    else:
        kept = np.delete(np.arange(n_base), _unique_positions(model.removed, n_base, "removed"))
        n_rows = len(kept) + n_new
    if model.index is None:
        if kept is not None:
            raise InvalidSessionState("rows changed but the index is missing")
        return base_index, None
    if isinstance(model.index, RangeShapeModel):
        if model.index.step == 0:
            raise InvalidSessionState("range index step must not be 0")
        index: pd.Index = _range_index(model.index.start, model.index.stop, model.index.step, base_index.name)
    else:
        runs = tuple((first, length) for first, length in model.index.runs)
        if any(length < 1 for _, length in runs):
            raise InvalidSessionState("index runs must have a positive length")
        index = _runs_index(runs, base_index.name)
    if len(index) != n_rows:
        raise InvalidSessionState(f"the index has {len(index)} labels for {n_rows} rows")
    return index, kept


@functools.lru_cache(maxsize=256)
def _range_index(start: int, stop: int, step: int, name: Any) -> pd.Index:
    """Cached as :func:`_runs_index` (an Index is immutable)."""
    return pd.RangeIndex(start, stop, step, name=name)


@functools.lru_cache(maxsize=256)
def _runs_index(runs: tuple[tuple[int, int], ...], name: Any) -> pd.Index:
    """The int64 index these runs spell. Cached: an Index is immutable, so sessions whose rows changed
    alike (a row appended to the same table) share one, and building it was a fifth of decoding them."""
    parts = [np.arange(first, first + length, dtype=np.int64) for first, length in runs]
    labels = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    return pd.Index(labels, dtype=np.int64, name=name)


def decode_table_diff(model: DiffTableModel, bt: BaseTable) -> pd.DataFrame:
    base = bt.df
    if is_empty_diff(model):
        return base.copy(deep=False)
    if not bt.diffable:
        raise InvalidSessionState("this base table can only be restored in full")
    columns = list(base.columns)
    unknown = (set(model.cells) | set(model.retyped)) - set(columns)
    if unknown:
        raise InvalidSessionState(f"unknown columns {sorted(unknown)}")
    if set(model.cells) & set(model.retyped):
        raise InvalidSessionState("a column is both retyped and changed by cells")
    index, kept = _decoded_index(model, bt)
    n_new = model.appended.count if model.appended is not None else 0
    if model.appended is not None and set(model.appended.data) != set(columns) - set(model.retyped):
        raise InvalidSessionState("appended rows must give every column that is not retyped")

    if kept is not None:
        return _rebuilt_frame(model, bt, index, None if kept is _ALL_ROWS else kept, n_new)
    # same rows: share untouched base columns (copy-on-write keeps them safe)
    df = base.copy(deep=False)
    if index is not base.index:
        df.index = index
    for i, name in enumerate(columns):
        if name in model.retyped:
            arr, kind = decode_column(model.retyped[name], len(index))
        elif name in model.cells:
            kind = bt.kinds[i]
            arr = bt.arrays[i].copy()
            _write_cells(arr, model.cells[name], len(index), name, kind)
            arr = to_pandas_array(arr, kind)
        else:
            continue
        df.isetitem(i, pd.Series(arr, index=df.index, dtype=pandas_dtype(kind), copy=False))
    return df


def _write_cells(dest: np.ndarray, change: CellsModel, n_kept: int, name: str, kind: str) -> None:
    if len(change.rows) != len(change.values):
        raise InvalidSessionState(f"cells of {name}: rows and values differ in length")
    dest[_unique_positions(change.rows, n_kept, f"cells of {name}")] = decode_values(change, kind)


def _rebuilt_frame(
    model: DiffTableModel, bt: BaseTable, index: pd.Index, kept: np.ndarray | None, n_new: int
) -> pd.DataFrame:
    """Rows were removed or appended (``kept``: the kept base rows, None for all of them): every column is
    written once, straight into the 2-D block of its dtype that pandas keeps it in (one per numpy dtype, a
    ``str`` column in its own array), rather than gathered, concatenated and then stacked into that block."""
    columns = list(bt.df.columns)
    n_rows = len(index)
    n_kept = n_rows - n_new
    kinds = [model.retyped[name].dtype if name in model.retyped else bt.kinds[i] for i, name in enumerate(columns)]
    groups: dict[str, list[int]] = {}
    for i, kind in enumerate(kinds):
        if kind != "str":
            groups.setdefault(kind, []).append(i)
    blocks = {kind: np.empty((len(positions), n_rows), dtype=pandas_dtype(kind)) for kind, positions in groups.items()}
    row = {i: j for positions in groups.values() for j, i in enumerate(positions)}
    out: list[tuple[Any, list[int]]] = [(blocks[kind], positions) for kind, positions in groups.items()]
    for i, name in enumerate(columns):
        kind = kinds[i]
        if name in model.retyped:
            arr, _ = decode_column(model.retyped[name], n_rows)
            if kind == "str":
                out.append((arr, [i]))
            else:
                blocks[kind][row[i]] = arr
            continue
        dest = np.empty(n_rows, dtype=object) if kind == "str" else blocks[kind][row[i]]
        if kept is None:
            dest[:n_kept] = bt.arrays[i]
        else:
            np.take(bt.arrays[i], kept, out=dest[:n_kept])
        if model.appended is not None and n_new:
            extra = model.appended.data[name]
            if len(extra.values) != n_new:
                raise InvalidSessionState(f"appended column {name} has the wrong length")
            dest[n_kept:] = decode_values(extra, kind)
        change = model.cells.get(name)
        if change is not None:
            _write_cells(dest, change, n_kept, name, kind)
        if kind == "str":
            out.append((to_pandas_array(dest, kind), [i]))
    return frame_from_blocks(out, kinds, index, bt.df.columns)
