"""The 27 tools: NeMo Gym 0.7.0's behaviour on the cases that tell it apart from a look-alike.

Each expected answer here was checked against the reference by the conformance suite
(``tests/conformance/test_workplace_assistant.py``, which compares every answer and table with NeMo
Gym's own modules); these tests name the behaviours so a change to one reads as what it is.
"""

from __future__ import annotations

import inspect
import json
import math

import numpy as np
import pandas as pd
import pytest

from gym_services.resources.workplace_assistant.environment import (
    ANALYTICS,
    CALENDAR,
    CRM,
    DATA_DIR,
    EMAILS,
    PLOTS,
    TABLE_KEYS,
    TASKS,
    WorkplaceEnvironment,
    pristine_tables,
)
from gym_services.resources.workplace_assistant.tools import call_tool, tool_schemas, tool_specs


def rows(env: WorkplaceEnvironment, key, column: str, value: str) -> pd.DataFrame:
    df = env.get(key)
    return df[df[column].to_numpy() == value]


def err(name: str, text: str) -> str:
    return f"Error executing tool '{name}': {text}"


# --------------------------------------------------------------------------- registry and loading


def test_exactly_the_27_tools_with_the_definition_files_parameters() -> None:
    specs = tool_specs()
    assert len(specs) == 27
    declared: dict[str, dict] = {}
    for path in sorted((DATA_DIR / "tools").glob("*.json")):
        if path.name == "environment.json":
            continue
        for tool in json.loads(path.read_text())["tools"]:
            declared[tool["name"]] = tool["parameters"]["properties"]
    assert set(specs) == set(declared)
    for name, spec in specs.items():
        assert list(spec.parameters) == list(declared[name]), name
        # the method takes exactly the declared parameters after self (so odd calls fail alike)
        params = list(inspect.signature(getattr(spec.toolkit_class, spec.method)).parameters)
        assert params == ["self", *declared[name]], name
    assert [s["name"] for s in tool_schemas()] == list(specs)


def test_sessions_share_nothing_writable(env: WorkplaceEnvironment) -> None:
    other = WorkplaceEnvironment.fresh()
    call_tool(
        env,
        "customer_relationship_manager_update_customer",
        {"customer_id": "00000095", "field": "status", "new_value": "Won"},
    )
    call_tool(
        env,
        "analytics_create_plot",
        {"time_min": "a", "time_max": "b", "value_to_plot": "total_visits", "plot_type": "bar"},
    )
    call_tool(env, "analytics_get_average_session_duration", {})
    assert rows(other, CRM, "customer_id", "00000095")["status"].iloc[0] == "Lead"
    assert other.get(PLOTS).empty and other.get(ANALYTICS)["session_duration_seconds"].dtype == object
    pristine = pristine_tables().tables
    assert (
        rows(WorkplaceEnvironment(dict(pristine), pristine_tables()), CRM, "customer_id", "00000095")["status"].iloc[0]
        == "Lead"
    )
    assert pristine[PLOTS].empty


def test_tables_load_like_the_reference(env: WorkplaceEnvironment) -> None:
    shapes = {key: env.get(key).shape for key in TABLE_KEYS}
    assert shapes == {
        ("company_directory", "_emails"): (20, 1),
        ("email", "_emails"): (500, 6),
        ("calendar", "_calendar_events"): (300, 5),
        ("analytics", "_analytics_data"): (1000, 6),
        ("analytics", "_plots_data"): (0, 1),
        ("project_management", "_project_tasks"): (300, 6),
        ("customer_relationship_manager", "_crm_data"): (200, 10),
    }
    assert env.get(ANALYTICS)["user_engaged"].dtype == bool
    for key in TABLE_KEYS:
        if key != ANALYTICS:
            assert all(t.kind == "O" for t in env.get(key).dtypes), key
    phones = env.get(CRM)["customer_phone"].to_numpy()
    blank = [v for v in phones if not isinstance(v, str)]
    assert len(blank) == 100 and all(isinstance(v, float) and math.isnan(v) for v in blank)  # empty cells: NaN


# --------------------------------------------------------------------------- the route's error texts


def test_unknown_tools_and_arguments_come_back_as_the_python_error(env: WorkplaceEnvironment) -> None:
    assert call_tool(env, "email_fly", {}) == err("email_fly", "'email_fly'")
    assert call_tool(env, "email_send_email", {"recipient": "a@b.c", "subject": "s", "body": "b", "cc": "x"}) == err(
        "email_send_email", "EmailTool.send_email() got an unexpected keyword argument 'cc'"
    )
    assert call_tool(env, "calendar_delete_event", {"self": 1}) == err(
        "calendar_delete_event", "CalendarTool.delete_event() got multiple values for argument 'self'"
    )
    assert call_tool(env, "calendar_search_events", {"query": "("}) == err(
        "calendar_search_events", "missing ), unterminated subpattern at position 0"
    )
    assert (
        call_tool(env, "email_search_emails", {"page_size": 0})
        == "Error searching emails: integer division or modulo by zero"
    )
    # null arguments are dropped: the tool's default applies
    assert call_tool(env, "email_delete_email", {"email_id": None}) == "Email ID not provided."


# --------------------------------------------------------------------------- email


def test_email_ids_subjects_and_check_order(env: WorkplaceEnvironment) -> None:
    assert call_tool(env, "email_get_email_information_by_id", {"email_id": "00000057", "field": "cc"}) == (
        "Field 'cc' not found. Available fields: email_id, inbox/outbox, sender/recipient, subject, sent_datetime, body"
    )
    assert call_tool(env, "email_reply_email", {"email_id": "00000057", "body": "ok"}) == "Email replied successfully."
    assert (
        call_tool(env, "email_forward_email", {"email_id": "nope", "recipient": "bad"})
        == "Invalid recipient email address."
    )
    assert call_tool(env, "email_forward_email", {"email_id": "00000057", "recipient": "Raj.Patel@atlas.com"}) == (
        "Email forwarded successfully."
    )
    emails = env.get(EMAILS)
    original = rows(env, EMAILS, "email_id", "00000057").iloc[0]
    assert emails["email_id"].tolist()[-2:] == ["500", "501"]  # no zero padding
    assert emails["subject"].tolist()[-2:] == [f"RE: {original['subject']}", f"FW: {original['subject']}"]
    assert emails["sender/recipient"].iloc[-1] == "raj.patel@atlas.com"
    assert emails["sent_datetime"].iloc[-1] == "2023-11-30 23:59:00"
    assert isinstance(emails.index, pd.RangeIndex) and len(emails) == 502


def test_email_search_pages_clamp_and_dates_parse(env: WorkplaceEnvironment) -> None:
    found = call_tool(env, "email_search_emails", {"query": "update", "page": 999, "page_size": 2})
    pages = found["pagination"]
    assert pages["page"] == pages["total_pages"] and len(found["emails"]) in (1, 2)
    dated = call_tool(env, "email_search_emails", {"query": "", "date_min": "Nov 20 2023", "page_size": 100})
    assert all(e["sent_datetime"] >= "2023-11-20" for e in dated["emails"])
    sent = [e["sent_datetime"] for e in dated["emails"]]
    assert sent == sorted(sent, reverse=True)


# --------------------------------------------------------------------------- calendar


def test_calendar_ids_search_order_and_labels(env: WorkplaceEnvironment) -> None:
    assert call_tool(env, "calendar_get_event_information_by_id", {"event_id": "13", "field": "event_name"}) == (
        "Invalid event ID format. Expected 8-digit ID."
    )
    assert call_tool(env, "calendar_update_event", {"event_id": "00000252", "field": "event_id", "new_value": "1"}) == (
        "Invalid field. Available fields are: event_name, participant_email, event_start, duration"
    )
    found = call_tool(env, "calendar_search_events", {"query": "sync", "time_min": "2023-11-01", "page_size": 50})
    starts = [e["event_start"] for e in found["events"]]
    assert starts == sorted(starts, reverse=True) and min(starts) >= "2023-11-01"
    new_id = call_tool(
        env,
        "calendar_create_event",
        {"event_name": "x", "participant_email": "A@B.C", "event_start": "2023-12-01 10:00:00", "duration": 30},
    )
    events = env.get(CALENDAR)
    assert new_id == "00000300" and events.index[-1] == 0 and not events.index.is_unique  # label 0 again
    assert events["duration"].iloc[-1] == 30 and events["participant_email"].iloc[-1] == "a@b.c"


# --------------------------------------------------------------------------- analytics


def test_analytics_counts_per_date_and_the_float_side_effect(env: WorkplaceEnvironment) -> None:
    counts = call_tool(env, "analytics_total_visits_count", {"time_min": "2023-11-01", "time_max": "2023-11-01"})
    assert counts == {"2023-11-01": 15}
    engaged = call_tool(env, "analytics_engaged_users_count", {"time_min": "2023-11-01", "time_max": "2023-11-02"})
    assert set(engaged) == {"2023-11-01", "2023-11-02"} and all(isinstance(v, int) for v in engaged.values())
    before = call_tool(env, "analytics_get_visitor_information_by_id", {"visitor_id": "0860"})
    assert before[0]["session_duration_seconds"] == "4"
    call_tool(env, "analytics_get_average_session_duration", {"time_min": "2023-11-01"})  # a copy: no effect
    assert env.get(ANALYTICS)["session_duration_seconds"].dtype == object
    call_tool(env, "analytics_get_average_session_duration", {})  # the whole table: converted in place
    assert env.get(ANALYTICS)["session_duration_seconds"].dtype == np.float64
    after = call_tool(env, "analytics_get_visitor_information_by_id", {"visitor_id": "0860"})
    assert after[0]["session_duration_seconds"] == 4.0
    assert call_tool(
        env,
        "analytics_create_plot",
        {"time_min": "2023-11-01", "time_max": "x", "value_to_plot": "total_visits", "plot_type": "bar"},
    ) == ("plots/2023-11-01_x_total_visits_bar.png")
    assert env.get(PLOTS).index.tolist() == [0]


# --------------------------------------------------------------------------- project management and CRM


def test_tasks_assignees_and_id_updates(env: WorkplaceEnvironment) -> None:
    assert call_tool(
        env,
        "project_management_create_task",
        {
            "task_name": "t",
            "assigned_to_email": "someone@example.com",
            "list_name": "Backlog",
            "due_date": "2023-12-01",
            "board": "Design",
        },
    ) == ("Assignee email not valid. Please choose from the list of team members.")
    assert (
        call_tool(
            env, "project_management_update_task", {"task_id": "00000149", "field": "task_id", "new_value": "00000001"}
        )
        == "Task updated successfully."
    )
    assert not rows(env, TASKS, "task_id", "00000001").empty
    assert call_tool(env, "project_management_search_tasks", {"assigned_to_email": "not-an-address"}) == (
        "Invalid email format for assigned_to_email."
    )


def test_crm_notes_default_statuses_and_paging(env: WorkplaceEnvironment) -> None:
    new_id = call_tool(
        env,
        "customer_relationship_manager_add_customer",
        {"customer_name": "N", "assigned_to_email": "A@atlas.com", "status": "Closed"},
    )  # status not checked on add
    added = rows(env, CRM, "customer_id", new_id).iloc[0]
    assert added["notes"] == "" and added["customer_phone"] is None and added["status"] == "Closed"
    assert call_tool(
        env,
        "customer_relationship_manager_update_customer",
        {"customer_id": "00000095", "field": "status", "new_value": "Closed"},
    ) == ("Status not valid. Please choose from: 'Qualified', 'Won', 'Lost', 'Lead', 'Proposal'")
    paged = call_tool(
        env, "customer_relationship_manager_search_customers", {"status": "won", "page": 0, "page_size": 3}
    )
    assert paged["pagination"]["page"] == 1 and len(paged["customers"]) == 3
    assert call_tool(env, "customer_relationship_manager_search_customers", {}) == (
        "No search parameters provided. Please provide at least one parameter."
    )


def test_same_calls_same_answers() -> None:
    calls = [
        ("email_send_email", {"recipient": "raj.patel@atlas.com", "subject": "s", "body": "b"}),
        (
            "calendar_create_event",
            {
                "event_name": "e",
                "participant_email": "raj.patel@atlas.com",
                "event_start": "2023-12-01 10:00:00",
                "duration": "30",
            },
        ),
        (
            "customer_relationship_manager_add_customer",
            {"customer_name": "c", "assigned_to_email": "x@y.z", "status": "Lead"},
        ),
    ]
    a, b = WorkplaceEnvironment.fresh(), WorkplaceEnvironment.fresh()
    assert [call_tool(a, n, x) for n, x in calls] == [call_tool(b, n, x) for n, x in calls]
    for key in TABLE_KEYS:
        assert a.get(key).equals(b.get(key))


@pytest.mark.parametrize("name", sorted(tool_specs()))
def test_every_tool_answers_an_empty_call(env: WorkplaceEnvironment, name: str) -> None:
    out = call_tool(env, name, {})
    assert isinstance(out, (str, dict, list)), out
