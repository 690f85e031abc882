"""The codec's fast paths (issue 14) give exactly what the general paths give, and refuse what they refuse."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gym_services.resources.workplace_assistant import codec
from gym_services.resources.workplace_assistant.codec_columns import STR_DTYPE, build_frame, pandas_dtype
from gym_services.resources.workplace_assistant.environment import TABLE_KEYS, pristine_tables
from gym_services.resources.workplace_assistant.sessions import WorkplaceSessions

from .helpers import SCENARIOS, json_round_trip


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
