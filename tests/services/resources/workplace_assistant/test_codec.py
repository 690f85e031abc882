"""Checkpoint codec: exact round trips, NaN vs None, diff size, strict decoding, unencodable values."""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gym_services.resources.workplace_assistant import codec, codec_columns, codec_diff, codec_models
from gym_services.resources.workplace_assistant.codec import (
    InvalidSessionState,
    UnencodableStateError,
    base_digest,
    decode_base,
    decode_session,
    encode_base,
    encode_plain,
    encode_session,
)
from gym_services.resources.workplace_assistant.compare import environment_differences, table_differences
from gym_services.resources.workplace_assistant.environment import (
    ANALYTICS,
    CALENDAR,
    CRM,
    EMAILS,
    PLOTS,
    TABLE_KEYS,
    TASKS,
    PristineTables,
    WorkplaceEnvironment,
    load_tables_from_csv,
    pristine_tables,
)

from .helpers import FOLLOW_UPS, SCENARIOS, json_round_trip, run

BASES = {base_digest(pristine_tables()): pristine_tables()}


def restore(state: dict) -> WorkplaceEnvironment:
    return decode_session(json_round_trip(state), BASES)


def assert_identical(a: WorkplaceEnvironment, b: WorkplaceEnvironment) -> None:
    for key, df in a.items():
        other = b.get(key)
        pd.testing.assert_frame_equal(df, other, check_exact=True, check_index_type=True, check_column_type=True)
        assert list(df.dtypes) == list(other.dtypes)
        assert type(df.index) is type(other.index) and df.index.dtype == other.index.dtype
    assert environment_differences(a, b) == []


def kinds(df: pd.DataFrame, column: str) -> list[str]:
    return [
        "NaN" if isinstance(v, float) and math.isnan(v) else "None" if v is None else "value"
        for v in df[column].to_numpy()
    ]


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_round_trip_is_exact_and_restored_session_answers_the_same(scenario: str) -> None:
    env = WorkplaceEnvironment.fresh()
    run(env, SCENARIOS[scenario])
    state = encode_session(env)
    restored = restore(state)
    assert_identical(env, restored)
    # the restored session answers every later call byte for byte as the original would
    assert run(restored, FOLLOW_UPS) == run(env, FOLLOW_UPS)
    assert_identical(env, restored)
    # and a second checkpoint of the continued sessions is identical too
    assert encode_session(env) == encode_session(restored)


def test_untouched_session_is_all_empty_diffs() -> None:
    state = encode_session(WorkplaceEnvironment.fresh())
    assert state["schema_version"] == 2 and state["base"] == base_digest(pristine_tables())
    assert all(t == {} for tables in state["tables"].values() for t in tables.values())
    env = WorkplaceEnvironment.fresh()
    run(env, [("email_search_emails", {"query": "kofi"}), ("analytics_total_visits_count", {})])
    assert encode_session(env) == state  # reads change nothing


def test_diff_stores_only_what_changed() -> None:
    env = WorkplaceEnvironment.fresh()
    run(env, SCENARIOS["tasks"] + SCENARIOS["delete_event"] + SCENARIOS["update_event"])
    tables = encode_session(env)["tables"]
    tasks = tables["project_management"]["_project_tasks"]
    assert tasks["removed"] == [1]  # task 00000037 sat at position 1
    # the create (first) numbered the rows 0..300, the delete then left a gap at 1
    assert tasks["index"] == {"kind": "runs", "runs": [[0, 1], [2, 299]]}
    assert tasks["appended"]["count"] == 1
    assert tasks["cells"] == {"list_name": {"rows": [0], "values": ["In Review"]}}
    events = tables["calendar"]["_calendar_events"]
    assert events["removed"] == [0]
    assert events["index"] == {"kind": "runs", "runs": [[1, 299]]}
    assert list(events["cells"]) == ["event_name"] and events["cells"]["event_name"]["values"] == [
        "Risk Management Forum"
    ]
    assert tables["email"]["_emails"] == {} and tables["customer_relationship_manager"]["_crm_data"] == {}


def test_repeated_and_renumbered_labels_stay_small_and_exact() -> None:
    """NeMo Gym's calendar appends under label 0 again; email appends renumber 0..n-1 after a delete."""
    env = WorkplaceEnvironment.fresh()
    run(env, SCENARIOS["delete_then_send"] + SCENARIOS["create_event"] + SCENARIOS["delete_event"])
    state = encode_session(env)
    events = state["tables"]["calendar"]["_calendar_events"]
    assert events["index"] == {"kind": "runs", "runs": [[1, 299], [0, 1]]} and events["appended"]["count"] == 1
    emails = state["tables"]["email"]["_emails"]
    assert emails["index"]["kind"] == "range" and "cells" not in emails and len(emails["removed"]) == 1
    assert len(json.dumps(state)) < 3_000
    assert_identical(env, restore(state))


def test_typical_record_is_small_against_plain() -> None:
    env = WorkplaceEnvironment.fresh()
    run(env, SCENARIOS["crm"] + SCENARIOS["send_email"] + SCENARIOS["delete_event"] + SCENARIOS["create_plot"])
    record = len(json.dumps(encode_session(env), separators=(",", ":")))
    plain = len(json.dumps(encode_plain(env), separators=(",", ":")))
    assert record <= 10_000
    assert plain >= 30 * record
    assert plain > 250_000  # the full tables, as the known encoding


def test_plain_encoding_round_trips_exactly() -> None:
    env = WorkplaceEnvironment.fresh()
    run(env, SCENARIOS["everything"])
    tables = codec.decode_plain(json_round_trip(encode_plain(env)))
    for key, df in env.items():
        assert table_differences(df, tables[key]) == []


# --------------------------------------------------------------------------- NaN vs None


def test_nan_and_none_stay_apart() -> None:
    env = WorkplaceEnvironment.fresh()
    run(env, SCENARIOS["crm"])  # appended customer: None in optional fields; CSV blanks: NaN
    crm = env.get(CRM)
    phone = crm["customer_phone"].to_numpy()
    row_189 = int(np.flatnonzero(crm["customer_id"].to_numpy() == "00000189")[0])
    crm.loc[crm.index[0], "customer_phone"] = None  # None into a cell that was NaN (00000189)
    crm.loc[crm.index[2], "customer_phone"] = np.nan  # NaN into a cell that held a number
    assert row_189 == 0 and phone is not crm["customer_phone"].to_numpy()
    before = kinds(crm, "customer_phone")
    assert {"NaN", "None", "value"} <= set(before)
    state = encode_session(env)
    cells = state["tables"]["customer_relationship_manager"]["_crm_data"]["cells"]["customer_phone"]
    assert cells["values"][:1] == [None] and cells.get("nan") == [1]  # row 0 -> None, row 2 -> NaN
    restored = restore(state)
    assert kinds(restored.get(CRM), "customer_phone") == before
    assert kinds(restored.get(CRM), "notes") == kinds(crm, "notes")
    assert_identical(env, restored)


def test_dropping_nan_restoration_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation check: a decoder that turns NaN lists into None must fail the comparison (and
    ``assert_frame_equal`` alone would not notice, hence the strict comparison)."""
    env = WorkplaceEnvironment.fresh()
    run(env, SCENARIOS["crm"])
    crm = env.get(CRM)
    crm.loc[crm.index[2], "customer_phone"] = np.nan
    state = json_round_trip(encode_session(env))
    base_state = json_round_trip(encode_base(pristine_tables()))
    digest = base_digest(pristine_tables())
    assert_identical(env, decode_session(state, {digest: decode_base(digest, base_state)}))

    real = codec_columns.decode_values

    def without_nan(model, kind):  # treats the NaN list as if every null were None
        return real(model.model_copy(update={"nan": []}), kind)

    monkeypatch.setattr(codec_columns, "decode_values", without_nan)
    monkeypatch.setattr(codec_diff, "decode_values", without_nan)
    broken = decode_session(state, {digest: decode_base(digest, base_state)})
    problems = environment_differences(env, broken)
    assert any("customer_phone" in p and "NaN != None" in p for p in problems), problems
    for key, df in env.items():  # the loose comparison cannot tell
        pd.testing.assert_frame_equal(df, broken.get(key), check_exact=True)


# --------------------------------------------------------------------------- changes behind the tools' back


def test_changes_without_tools_are_still_encoded_exactly() -> None:
    env = WorkplaceEnvironment.fresh()
    emails = env.get(EMAILS)
    emails.iloc[3, 3] = "edited in place"  # a cell, no tool involved
    tasks = env.get(TASKS)
    env.put(TASKS, tasks.sort_values("task_id", kind="stable"))  # reordered rows -> stored in full
    analytics = env.get(ANALYTICS)
    analytics["user_engaged"] = analytics["user_engaged"].astype(object)  # bool column becomes object
    analytics.loc[analytics.index[0], "user_engaged"] = None
    calendar = env.get(CALENDAR)
    env.put(CALENDAR, pd.concat([calendar, calendar.iloc[:1]]))  # duplicate label -> stored in full
    state = encode_session(env)
    tables = state["tables"]
    assert tables["email"]["_emails"]["cells"]["subject"]["values"] == ["edited in place"]
    assert "full" in tables["project_management"]["_project_tasks"]
    assert "full" in tables["calendar"]["_calendar_events"]
    assert tables["analytics"]["_analytics_data"]["retyped"]["user_engaged"]["dtype"] == "object"
    assert_identical(env, restore(state))


def test_type_only_changes_are_seen() -> None:
    env = WorkplaceEnvironment.fresh()
    crm = env.get(CRM)
    crm.loc[crm.index[5], "customer_name"] = np.str_(crm["customer_name"].iloc[5])  # equal value, other type
    with pytest.raises(UnencodableStateError):
        encode_session(env)
    env2 = WorkplaceEnvironment.fresh()
    c2 = env2.get(CRM)
    same_objects = c2["customer_id"].to_numpy().copy()  # same objects, new buffer: no change
    c2["customer_id"] = pd.Series(same_objects, index=c2.index, dtype=object)
    assert encode_session(env2)["tables"]["customer_relationship_manager"]["_crm_data"] == {}
    c2["customer_id"] = pd.array(same_objects, dtype=pd.StringDtype("python", na_value=np.nan))  # a real change
    retyped = encode_session(env2)["tables"]["customer_relationship_manager"]["_crm_data"]["retyped"]
    assert retyped["customer_id"]["dtype"] == "str"
    assert_identical(env2, restore(encode_session(env2)))


def test_mixed_json_scalars_round_trip_exactly() -> None:
    env = WorkplaceEnvironment.fresh()
    crm = env.get(CRM)
    for i, value in enumerate([1, True, 2.5, -0.0, "x", None, 0.0]):
        crm.loc[crm.index[i], "notes"] = value
    restored = restore(encode_session(env))
    got = restored.get(CRM)["notes"].to_numpy()[:7]
    want = crm["notes"].to_numpy()[:7]
    assert [type(v) for v in got] == [type(v) for v in want]
    assert math.copysign(1, got[3]) == -1.0
    assert_identical(env, restored)


# --------------------------------------------------------------------------- unencodable values


@pytest.mark.parametrize(
    "value",
    [
        {1: "a"},
        [1, (2,)],
        [float("nan")],
        {1},
        np.int64(3),
        np.float64(1.5),
        float("inf"),
        dt.datetime(2023, 11, 30),
        b"bytes",
    ],
    ids=[
        "dict int key",
        "list with tuple",
        "list with nan",
        "set",
        "np.int64",
        "np.float64",
        "inf",
        "datetime",
        "bytes",
    ],
)
def test_encode_rejects_values_json_cannot_carry(value: object) -> None:
    env = WorkplaceEnvironment.fresh()
    crm = env.get(CRM)
    crm["notes"] = crm["notes"].astype(object)
    arr = crm["notes"].to_numpy().copy()
    arr[4] = value
    crm["notes"] = pd.Series(arr, index=crm.index, dtype=object)
    with pytest.raises(UnencodableStateError):
        encode_session(env)
    with pytest.raises(UnencodableStateError):
        encode_plain(env)


def test_encode_rejects_unsupported_dtypes_and_appended_bad_values() -> None:
    env = WorkplaceEnvironment.fresh()
    env.get(TASKS)["due_date"] = pd.to_datetime(env.get(TASKS)["due_date"])
    with pytest.raises(UnencodableStateError):
        encode_session(env)
    env = WorkplaceEnvironment.fresh()
    plots = env.get(PLOTS)
    env.put(PLOTS, pd.concat([plots, pd.DataFrame({"file_path": pd.Series([object()], dtype=object)})]))
    with pytest.raises(UnencodableStateError):
        encode_session(env)


# --------------------------------------------------------------------------- strict decoding


def _valid_state() -> dict:
    env = WorkplaceEnvironment.fresh()
    run(env, SCENARIOS["everything"])
    plots = env.get(PLOTS).copy()
    plots["note"] = "x"  # another column: this table is stored in full
    env.put(PLOTS, plots)
    state = json_round_trip(encode_session(env))
    assert "full" in _table(state, "analytics", "_plots_data")
    return state


def _table(state: dict, container: str, attr: str) -> dict:
    return state["tables"][container][attr]


def _mutations() -> dict[str, Callable[[dict], Any]]:
    return {
        "not an object": lambda s: ["schema_version", 1],
        "schema_version 1": lambda s: {**s, "schema_version": 1},
        "schema_version 3": lambda s: {**s, "schema_version": 3},
        "schema_version missing": lambda s: {k: v for k, v in s.items() if k != "schema_version"},
        "schema_version true": lambda s: {**s, "schema_version": True},
        "schema_version string": lambda s: {**s, "schema_version": "1"},
        "extra top-level key": lambda s: {**s, "extra": 1},
        "unknown base": lambda s: {**s, "base": "0" * 64},
        "malformed base": lambda s: {**s, "base": "xyz"},
        "missing container": lambda s: {**s, "tables": {k: v for k, v in s["tables"].items() if k != "calendar"}},
        "extra container": lambda s: {**s, "tables": {**s["tables"], "slack": {"_messages": {}}}},
        "missing table": lambda s: {**s, "tables": {**s["tables"], "analytics": {"_analytics_data": {}}}},
        "extra table": lambda s: {**s, "tables": {**s["tables"], "email": {"_emails": {}, "_drafts": {}}}},
        "tables not an object": lambda s: {**s, "tables": []},
        "unknown diff key": lambda s: _set(s, "email", "_emails", "renamed", {}),
        "appended column too short": lambda s: _edit(
            s, "email", "_emails", lambda t: t["appended"]["data"]["subject"]["values"].pop()
        ),
        "appended column missing": lambda s: _edit(s, "email", "_emails", lambda t: t["appended"]["data"].pop("body")),
        "cells rows/values length mismatch": lambda s: _edit(
            s, "project_management", "_project_tasks", lambda t: t["cells"]["list_name"]["values"].append("Backlog")
        ),
        "cells unknown column": lambda s: _edit(
            s,
            "project_management",
            "_project_tasks",
            lambda t: t["cells"].update(colour={"rows": [0], "values": ["red"]}),
        ),
        "cells unknown row": lambda s: _edit(
            s, "project_management", "_project_tasks", lambda t: t["cells"]["list_name"].update(rows=[99999])
        ),
        "removed unknown row": lambda s: _edit(s, "calendar", "_calendar_events", lambda t: t["removed"].append(12345)),
        "removed as strings": lambda s: _edit(s, "calendar", "_calendar_events", lambda t: t.update(removed=["0"])),
        "appended count zero": lambda s: _edit(
            s, "project_management", "_project_tasks", lambda t: t["appended"].update(count=0)
        ),
        "appended count off the index": lambda s: _edit(
            s, "project_management", "_project_tasks", lambda t: t["appended"].update(count=2)
        ),
        "index runs bad length": lambda s: _edit(
            s, "calendar", "_calendar_events", lambda t: t.update(index={"kind": "runs", "runs": [[0, 0]]})
        ),
        "index runs not pairs": lambda s: _edit(
            s, "calendar", "_calendar_events", lambda t: t.update(index={"kind": "runs", "runs": [[0]]})
        ),
        "cells row past the kept rows": lambda s: _edit(
            s,
            "email",
            "_emails",
            lambda t: t.update(cells={"subject": {"rows": [len(t.get("removed", [])) + 600], "values": ["x"]}}),
        ),
        "range index mismatch": lambda s: _edit(
            s,
            "calendar",
            "_calendar_events",
            lambda t: t.update(index={"kind": "range", "start": 0, "stop": 3, "step": 1}),
        ),
        "index shape missing": lambda s: _edit(s, "calendar", "_calendar_events", lambda t: t.pop("index")),
        "values not a list": lambda s: _edit(
            s, "email", "_emails", lambda t: t["appended"]["data"]["subject"].update(values="hi")
        ),
        "nan position not null": lambda s: _edit(
            s, "email", "_emails", lambda t: t["appended"]["data"]["subject"].update(nan=[0])
        ),
        "nan position out of range": lambda s: _edit(
            s, "customer_relationship_manager", "_crm_data", lambda t: t["appended"]["data"]["notes"].update(nan=[7])
        ),
        "nested value": lambda s: _edit(
            s, "email", "_emails", lambda t: t["appended"]["data"]["subject"]["values"].__setitem__(0, ["x"])
        ),
        "bool column gets a string": lambda s: _set(
            s, "analytics", "_analytics_data", "cells", {"user_engaged": {"rows": [0], "values": ["yes"]}}
        ),
        "full table column length mismatch": lambda s: _edit(
            s, "analytics", "_plots_data", lambda t: t["full"]["data"][0]["values"].append("plots/x.png")
        ),
        "full table unknown dtype": lambda s: _edit(
            s, "analytics", "_plots_data", lambda t: t["full"]["data"][0].update(dtype="datetime64[ns]")
        ),
        "full table columns/data mismatch": lambda s: _edit(
            s, "analytics", "_plots_data", lambda t: t["full"]["data"].append(t["full"]["data"][0])
        ),
    }


def _edit(state: dict, container: str, attr: str, fn) -> dict:
    state = copy.deepcopy(state)
    fn(_table(state, container, attr))
    return state


def _set(state: dict, container: str, attr: str, key: str, value) -> dict:
    return _edit(state, container, attr, lambda t: t.update({key: value}))


MUTATIONS = _mutations()


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_invalid_states_raise(kind: str) -> None:
    valid = _valid_state()
    decode_session(valid, BASES)  # the untouched state is fine
    with pytest.raises(InvalidSessionState):
        decode_session(MUTATIONS[kind](valid), BASES)


def test_invalid_state_is_a_value_error() -> None:
    from gym_services.control.participant import InvalidState

    assert issubclass(InvalidSessionState, InvalidState) and issubclass(InvalidSessionState, ValueError)
    assert issubclass(UnencodableStateError, ValueError)


# --------------------------------------------------------------------------- bases


def _other_pristine() -> PristineTables:
    tables = load_tables_from_csv()
    crm = tables[CRM]
    crm.loc[crm.index[0], "customer_name"] = "Someone Else"
    return PristineTables(tables)


def test_base_is_content_addressed_and_checked() -> None:
    encoded = json_round_trip(encode_base(pristine_tables()))
    digest = base_digest(pristine_tables())
    assert digest == codec.hashlib.sha256(codec.canonical_json(encoded)).hexdigest()
    restored = decode_base(digest, encoded)
    for key in TABLE_KEYS:
        assert table_differences(pristine_tables().tables[key], restored.tables[key]) == []
    tampered = copy.deepcopy(encoded)
    tampered["tables"]["email"]["_emails"]["data"][3]["values"][0] = "tampered"
    with pytest.raises(InvalidSessionState):
        decode_base(digest, tampered)


def test_sessions_of_another_base_restore_against_that_base() -> None:
    other = _other_pristine()
    assert base_digest(other) != base_digest(pristine_tables())
    env = WorkplaceEnvironment.fresh(other)
    run(env, SCENARIOS["crm"])
    state = json_round_trip(encode_session(env))
    with pytest.raises(InvalidSessionState, match="unknown base"):
        decode_session(state, BASES)
    stored = json_round_trip(encode_base(other))
    foreign = decode_base(base_digest(other), stored)
    restored = decode_session(state, {base_digest(other): foreign})
    assert_identical(env, restored)
    assert restored.get(CRM)["customer_name"].iloc[1] != "Someone Else"
    assert run(restored, FOLLOW_UPS) == run(env, FOLLOW_UPS)


def test_json_lists_and_objects_a_tool_stored_round_trip() -> None:
    """The tools store arguments as given (as NeMo Gym's do), so a model's list or object can become a cell."""
    env = WorkplaceEnvironment.fresh()
    run(
        env,
        [
            (
                "customer_relationship_manager_add_customer",
                {"customer_name": ["a", {"b": [1, 2.0, None, True]}], "assigned_to_email": "a@b.c", "status": {"x": 1}},
            ),
            ("email_send_email", {"recipient": "a@b.c", "subject": {"s": 1}, "body": [1]}),
        ],
    )
    state = json_round_trip(encode_session(env))
    restored = restore(state)
    assert_identical(env, restored)
    assert type(restored.get(CRM)["status"].iloc[-1]) is dict
    bad = copy.deepcopy(state)
    cells = bad["tables"]["email"]["_emails"]["appended"]["data"]["subject"]
    cells["json_cells"] = [[0, "not a container"]]
    with pytest.raises(InvalidSessionState):
        restore(bad)


def test_rows_removed_from_a_string_dtype_table_stay_a_diff() -> None:
    """pandas' python-backed string columns (the default dtype of text columns from pandas 3 on) are aligned by their
    key column like object columns: a deleted row is one removed position, not the whole table stored again."""
    n = 200
    base = pd.DataFrame(
        {"email_id": [f"{i:08d}" for i in range(n)], "body": [f"text {i}" for i in range(n)]},
        dtype=codec_columns.STR_DTYPE,
    )
    bt = codec_diff.BaseTable.of(base)
    session = base[base["email_id"] != "00000005"]
    encoded = codec_diff.encode_table(session, bt)
    assert encoded.get("removed") == [5] and "full" not in encoded and "cells" not in encoded
    restored = codec_diff.decode_table_diff(codec_models.DiffTableModel.model_validate(json_round_trip(encoded)), bt)
    pd.testing.assert_frame_equal(restored, session, check_exact=True)


@pytest.mark.parametrize("value", [[[1]], [[1, 2]], [1, 2], [1, 2, None], [{"a": 1}]])
def test_a_restored_session_stores_list_values_as_a_fresh_one_does(value: object) -> None:
    """Every session table is the session's own one-block frame before its first use (restored ones included), so
    a list written into a cell is stored (or refused) as in a fresh session and in NeMo Gym: ``[[1]]`` becomes the
    cell ``[1]``, not ``1``."""
    env = WorkplaceEnvironment.fresh()
    run(env, [("calendar_update_event", {"event_id": "00000013", "field": "duration", "new_value": "45"})])
    restored = restore(json_round_trip(encode_session(env)))
    calls = [
        ("calendar_update_event", {"event_id": "00000013", "field": "event_name", "new_value": value}),
        ("project_management_update_task", {"task_id": "00000149", "field": "task_name", "new_value": value}),
        ("calendar_get_event_information_by_id", {"event_id": "00000013", "field": "event_name"}),
    ]
    assert run(restored, calls) == run(env, calls)
    assert_identical(env, restored)
    if value == [[1]]:
        assert env.get(CALENDAR)["event_name"].iloc[0] == [1]
