"""The codec's fast paths give exactly what the general paths give, and refuse what they refuse."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest

from gym_services.resources.workplace_assistant import codec, codec_diff, codec_models
from gym_services.resources.workplace_assistant.codec_columns import (
    STR_DTYPE,
    build_frame,
    dtype_name,
    frame_from_blocks,
    iter_column_arrays,
    pandas_dtype,
)
from gym_services.resources.workplace_assistant.compare import environment_differences
from gym_services.resources.workplace_assistant.environment import (
    CALENDAR,
    EMAILS,
    TABLE_KEYS,
    WorkplaceEnvironment,
    pristine_tables,
)
from gym_services.resources.workplace_assistant.sessions import WorkplaceSessions

from .helpers import SCENARIOS, json_round_trip, run

BASES = {codec.base_digest(pristine_tables()): pristine_tables()}


def by_series(arrays, kinds, index, columns) -> pd.DataFrame:
    """The general construction: one Series per column of its dtype."""
    df = pd.DataFrame(
        {
            i: pd.Series(a, index=pd.RangeIndex(len(index)), dtype=pandas_dtype(k))
            for i, (a, k) in enumerate(zip(arrays, kinds, strict=True))
        }
    )
    df.index, df.columns = index, columns
    return df


def test_frames_built_from_arrays_equal_the_series_construction_for_every_kind() -> None:
    n = 4
    arrays = [
        np.array(["a", None, np.nan, {"k": 1}], dtype=object),
        pd.array(["x", np.nan, "z", "w"], dtype=STR_DTYPE),
        np.array(["x", "y", "z", "w"], dtype=object),  # a str column handed over as objects is converted
        np.array([1, 2, 3, 4], dtype=np.int64),
        np.array([1.0, np.nan, 2.5, 0.0]),
        np.array([True, False, True, True]),
        np.array([1, 2, 3, 4], dtype=object),  # cast like pd.Series(..., dtype="float64") casts it
    ]
    kinds = ["object", "str", "str", "int64", "float64", "bool", "float64"]
    index = pd.Index([7, 7, 3, 1], dtype=np.int64, name="row")  # not unique: the index labels are kept as given
    columns = pd.Index(list("abcdefg"))
    built, general = build_frame(arrays, kinds, index, columns), by_series(arrays, kinds, index, columns)
    pd.testing.assert_frame_equal(built, general, check_exact=True)
    assert list(built.dtypes) == list(general.dtypes)
    assert [type(v) for v in built["a"]] == [type(v) for v in general["a"]]  # None stays None, NaN stays NaN
    assert built["a"].iloc[1] is None and built["a"].iloc[2] is not None
    assert len(built) == n and built.index.equals(index)


def test_a_column_of_the_wrong_length_or_shape_is_refused() -> None:
    index, columns = pd.RangeIndex(3), pd.Index(["a", "b"])
    with pytest.raises(codec.InvalidSessionState, match="2 values for 3 rows"):
        build_frame([np.array([1, 2, 3]), np.array([1, 2])], ["int64", "int64"], index, columns)
    with pytest.raises(codec.InvalidSessionState):
        build_frame([np.zeros((3, 2)), np.zeros(3)], ["float64", "float64"], index, columns)


def test_untouched_tables_encode_as_unchanged_and_restore_as_the_shared_pristine_objects() -> None:
    store = WorkplaceSessions()
    store.seed("s")
    for name, args in SCENARIOS["crm"]:
        store.call_tool("s", name, args)
    _, tables = store.get("s").capture()
    encoded = codec.encode_tables(tables, store.get("s").base)
    untouched = [key for key in TABLE_KEYS if tables[key] is pristine_tables().tables[key]]
    assert untouched and all(encoded["tables"][k[0]][k[1]] == {} for k in untouched)
    # the general path (a shallow copy is not the pristine object) says the same
    copies = {key: df.copy(deep=False) for key, df in tables.items()}
    assert codec.encode_tables(copies, store.get("s").base) == encoded

    target = WorkplaceSessions()
    target.restore_session_states(json_round_trip({"s": encoded}))
    restored = target.get("s")
    _token, again = restored.capture()
    assert all(again[key] is pristine_tables().tables[key] for key in untouched)
    assert codec.encode_tables(again, restored.base) == encoded


def general_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables aligned as before the fast path: only one holding exactly the base's rows skips the general search
    (which sorts and searches every row's key)."""

    def same_rows(slots: np.ndarray, base_slots: np.ndarray, key_sorted: np.ndarray) -> bool:
        return len(slots) == len(base_slots) and np.array_equal(slots, base_slots)

    monkeypatch.setattr(codec_diff, "_base_then_new", same_rows)


def test_a_table_with_rows_only_appended_is_aligned_without_searching() -> None:
    store = WorkplaceSessions()
    store.seed("s")
    for name, args in SCENARIOS["send_email"] + SCENARIOS["create_event"]:
        store.call_tool("s", name, args)
    _, tables = store.get("s").capture()
    view = codec._base_view(store.get("s").base)
    for key in (EMAILS, CALENDAR):
        bt, df = view.tables[key], tables[key]
        columns = list(iter_column_arrays(df))
        kinds = [dtype_name(dtype) for _, dtype, _ in columns]
        assert len(df) == len(bt.df) + 1
        # every base row kept in place: no positions to list (the general search lists 0..n-1)
        assert codec_diff._align([a for _, _, a in columns], kinds, bt, len(df)) == (None, len(bt.df))


def test_an_appended_row_holding_a_base_rows_key_is_left_to_the_general_search() -> None:
    base = pristine_tables().tables[EMAILS]
    bt = codec._base_view(pristine_tables()).tables[EMAILS]
    again = pd.concat([base, base.iloc[[3]]], ignore_index=True)  # row 3's very key object appended again
    slots = codec_diff._slots(list(iter_column_arrays(again))[bt.key][2])
    assert bt.slots[bt.key] is not None and bt.key_sorted is not None
    assert not codec_diff._base_then_new(slots, bt.slots[bt.key], bt.key_sorted)
    assert codec_diff._base_then_new(slots[: len(base)], bt.slots[bt.key], bt.key_sorted)


def encoded_sessions(n: int, seed: int) -> dict[str, bytes]:
    """``n`` sessions, each after 1-4 scenarios drawn at random (the same ones for the same seed)."""
    rng = random.Random(seed)
    names = sorted(set(SCENARIOS) - {"everything"})
    store = WorkplaceSessions()
    for i in range(n):
        store.seed(f"s{i}")
        for name in rng.sample(names, rng.randint(1, 4)):
            for tool, args in SCENARIOS[name]:
                store.call_tool(f"s{i}", tool, args)
    return {sid: codec.canonical_json(state) for sid, state in store.export_session_states().items()}


def test_sessions_encode_to_the_same_bytes_as_with_the_general_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """300 sessions after random scenarios each (appends, updates, deletes on every table), and every scenario
    alone: the records are byte for byte what the general alignment writes, and restore exactly."""
    scenarios = {}
    for name, calls in SCENARIOS.items():
        env = WorkplaceEnvironment.fresh()
        run(env, calls)
        scenarios[name] = env
    fast = encoded_sessions(300, 7)
    fast_scenarios = {name: codec.canonical_json(codec.encode_session(env)) for name, env in scenarios.items()}
    with monkeypatch.context() as patched:
        general_alignment(patched)
        assert encoded_sessions(300, 7) == fast
        assert {name: codec.canonical_json(codec.encode_session(env)) for name, env in scenarios.items()} == (
            fast_scenarios
        )
    for name, env in scenarios.items():
        assert not environment_differences(env, codec.decode_session(json.loads(fast_scenarios[name]), BASES))


def test_frames_from_blocks_equal_the_general_construction_and_keep_the_blocks() -> None:
    """Restored tables are written straight into pandas' blocks: columns of one dtype at positions
    that need not be contiguous, ``str`` columns as their own arrays, every column where its position says."""
    objects = np.array([["a", None, {"k": 1}], [np.nan, "y", 3]], dtype=object)  # columns 0 and 3
    ints = np.array([[1, 2, 3]], dtype=np.int64)  # column 2
    floats = np.array([[1.5, np.nan, -0.0]])  # column 4
    flags = np.array([[True, False, True]])  # column 1
    text = pd.array(["s", np.nan, "u"], dtype=STR_DTYPE)  # column 5
    blocks = [(objects, [0, 3]), (ints, [2]), (floats, [4]), (flags, [1]), (text, [5])]
    kinds = ["object", "bool", "int64", "object", "float64", "str"]
    index, columns = pd.Index([4, 4, 9], dtype=np.int64, name="row"), pd.Index(list("abcdef"))
    built = frame_from_blocks(blocks, kinds, index, columns)
    arrays = [objects[0], flags[0], ints[0], objects[1], floats[0], text]
    pd.testing.assert_frame_equal(built, by_series(arrays, kinds, index, columns), check_exact=True)
    assert built["a"].iloc[1] is None and built["d"].iloc[0] is not None and built["a"].iloc[2] is objects[0, 2]
    assert built._mgr.nblocks == len(blocks)  # one block per dtype, as consolidated
    assert np.shares_memory(built._mgr.blocks[0].values, objects)  # no cell copied again
    with pytest.raises(codec.InvalidSessionState):
        frame_from_blocks([(objects, [0, 3]), (ints[:, :2], [2])], ["object", "int64", "object"], index, columns[:3])


def _mixed_base(n: int = 12) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": np.array([f"id{i}" for i in range(n)], dtype=object),
            "flag": np.array([i % 3 == 0 for i in range(n)]),
            "count": np.arange(n, dtype=np.int64),
            "note": np.array([None if i % 4 == 0 else f"n{i}" for i in range(n)], dtype=object),
            "score": np.array([np.nan if i % 5 == 0 else i / 2 for i in range(n)]),
            "text": pd.array([np.nan if i % 6 == 0 else f"t{i}" for i in range(n)], dtype=STR_DTYPE),
        }
    )


def _remove(df: pd.DataFrame, rows: list[int]) -> pd.DataFrame:
    return df.drop(index=df.index[rows])


def _append(df: pd.DataFrame) -> pd.DataFrame:
    row = pd.DataFrame(
        {"id": ["new"], "flag": [True], "count": [99], "note": [[1, 2]], "score": [np.nan], "text": ["z"]},
        index=[len(df) + 50],
    ).astype(df.dtypes.to_dict())
    return pd.concat([df, row])


def _cells(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df.iloc[1, df.columns.get_loc("note")] = "changed"
    df.iloc[2, df.columns.get_loc("count")] = -7
    df.iloc[0, df.columns.get_loc("text")] = "T"
    return df


def _retype(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["count"] = df["count"].astype(np.float64) + 0.5
    return df


ROW_EDITS = {
    "removed": lambda df: _remove(df, [0, 5, 11]),
    "appended": _append,
    "removed, appended, cells": lambda df: _cells(_append(_remove(df, [3, 4]))),
    "appended, retyped": lambda df: _retype(_append(df)),
    "removed, cells": lambda df: _cells(_remove(df, [7])),
}


@pytest.mark.parametrize("edit", sorted(ROW_EDITS))
def test_tables_whose_rows_changed_restore_exactly_with_the_base_cells(edit: str) -> None:
    """Every dtype the codec carries, through each way a table's rows change: the restored table equals the session's,
    each kept object cell is the base's very object, and the columns sit in one block per numpy dtype."""
    base = _mixed_base()
    bt = codec_diff.BaseTable.of(base)
    session = ROW_EDITS[edit](base)
    encoded = codec_diff.encode_table(session, bt)
    assert "full" not in encoded, encoded
    restored = codec_diff.decode_table_diff(codec_models.DiffTableModel.model_validate(json_round_trip(encoded)), bt)
    pd.testing.assert_frame_equal(restored, session, check_exact=True)
    assert list(restored.dtypes) == list(session.dtypes)
    assert [type(v) for v in restored["note"]] == [type(v) for v in session["note"]]
    for label in restored.index.intersection(base.index).unique():
        if restored.index.is_unique and restored.loc[label, "id"] == base.loc[label, "id"]:
            assert restored.loc[label, "id"] is base.loc[label, "id"]
    numpy_dtypes = {str(d) for d in restored.dtypes if d != STR_DTYPE}
    assert restored._mgr.nblocks == len(numpy_dtypes) + sum(d == STR_DTYPE for d in restored.dtypes)
