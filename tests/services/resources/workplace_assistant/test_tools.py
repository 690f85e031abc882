"""The 27 tools on realistic inputs: outputs, table effects, error texts, determinism."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from gym_services.resources.workplace_assistant.environment import (
    ANALYTICS,
    CALENDAR,
    CRM,
    CURRENT_TIME,
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


# --------------------------------------------------------------------------- registry


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
        # the implementation accepts exactly the declared parameters, after the environment
        code = spec.function.__code__
        params = code.co_varnames[1 : code.co_argcount]
        assert list(params) == list(declared[name]), name
    assert [s["name"] for s in tool_schemas()] == list(specs)


def test_sessions_share_nothing_writable(env: WorkplaceEnvironment) -> None:
    other = WorkplaceEnvironment.fresh()
    call_tool(env, "customer_relationship_manager_update_customer",
              {"customer_id": "00000095", "field": "status", "new_value": "Won"})
    assert rows(other, CRM, "customer_id", "00000095")["status"].iloc[0] == "Lead"
    assert rows(WorkplaceEnvironment(pristine_tables().tables.copy(), pristine_tables()), CRM,
                "customer_id", "00000095")["status"].iloc[0] == "Lead"


def test_tables_load_like_the_real_server(env: WorkplaceEnvironment) -> None:
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
    analytics = env.get(ANALYTICS)
    assert analytics["user_engaged"].dtype == np.dtype(bool)
    assert all(analytics[c].dtype == object for c in analytics.columns if c != "user_engaged")
    assert list(env.get(PLOTS).columns) == ["file_path"] and env.get(PLOTS)["file_path"].dtype == object
    phone = env.get(CRM)["customer_phone"].to_numpy()
    assert sum(isinstance(v, float) and math.isnan(v) for v in phone) == 100  # empty CSV cells


def test_unknown_tool_bad_arguments_and_none_arguments(env: WorkplaceEnvironment) -> None:
    assert call_tool(env, "email_fly", {}) == "Error executing tool 'email_fly': unknown tool 'email_fly'"
    assert call_tool(env, "email_delete_email", {"email_id": "1", "force": True}) == (
        "Error executing tool 'email_delete_email': unexpected argument 'force'"
    )
    assert call_tool(env, "email_search_emails", {"query": "x", "page": "2"}) == (
        "Error executing tool 'email_search_emails': argument 'page' must be of type integer, got str"
    )
    assert call_tool(env, "email_delete_email", "{not json").startswith(
        "Error executing tool 'email_delete_email': arguments are not valid JSON"
    )
    # None arguments are dropped, so the tool sees them as missing
    assert call_tool(env, "email_delete_email", {"email_id": None}) == "Email ID not provided."
    # JSON-string arguments, as the model sends them
    assert call_tool(env, "company_directory_find_email_address", '{"name": "raj"}') == ["raj.patel@atlas.com"]


# --------------------------------------------------------------------------- company directory


def test_find_email_address(env: WorkplaceEnvironment) -> None:
    assert call_tool(env, "company_directory_find_email_address", {"name": "Nadia"}) == ["nadia.moreau@atlas.com"]
    directory = (DATA_DIR / "csv_data/raw/email_addresses.csv").read_text().split()
    assert call_tool(env, "company_directory_find_email_address", {"name": "AN"}) == [a for a in directory if "an" in a]
    assert len(call_tool(env, "company_directory_find_email_address", {"name": "an"})) == 7
    assert call_tool(env, "company_directory_find_email_address", {"name": "zzz"}) == []
    assert call_tool(env, "company_directory_find_email_address", {}) == "Name not provided."


# --------------------------------------------------------------------------- email


def test_email_information_and_search(env: WorkplaceEnvironment) -> None:
    assert call_tool(env, "email_get_email_information_by_id", {"email_id": "00000057", "field": "sender/recipient"}) == {
        "sender/recipient": "carlos.rodriguez@atlas.com"
    }
    assert call_tool(env, "email_get_email_information_by_id", {"email_id": "99999999", "field": "body"}) == "Email not found."
    assert call_tool(env, "email_get_email_information_by_id", {"email_id": "00000057", "field": "cc"}) == "Field not found."
    assert call_tool(env, "email_get_email_information_by_id", {"email_id": "00000057"}) == "Field not provided."

    out = call_tool(env, "email_search_emails", {"query": "kofi", "page": 1, "page_size": 1})
    assert out["emails"][0]["email_id"] == "00000259"  # Kofi's newest email (as in the recorded rollout)
    assert out["pagination"] == {"total_emails": 26, "page": 1, "page_size": 1, "total_pages": 26}
    dated = call_tool(env, "email_search_emails", {"query": "kofi", "date_min": "2023-11-01", "date_max": "2023-11-15"})
    assert all("2023-11-01" <= e["sent_datetime"][:10] <= "2023-11-15" for e in dated["emails"])
    assert len(dated["emails"]) <= 5  # default page size
    assert call_tool(env, "email_search_emails", {"query": "no such words here"}) == "No emails found."
    assert call_tool(env, "email_search_emails", {"query": "kofi", "date_min": "Nov 1"}).startswith(
        "Error executing tool 'email_search_emails': date_min must be a date"
    )
    assert call_tool(env, "email_search_emails", {"query": "kofi", "page": 0}) == (
        "Error executing tool 'email_search_emails': page and page_size must be positive integers"
    )


def test_email_send_reply_forward_delete(env: WorkplaceEnvironment) -> None:
    assert call_tool(env, "email_send_email", {"recipient": "Raj.Patel@atlas.com", "subject": "Q4", "body": "See you"}) == (
        "Email sent successfully."
    )
    sent = rows(env, EMAILS, "email_id", "00000500").iloc[0].to_dict()
    assert sent == {"email_id": "00000500", "inbox/outbox": "outbox", "sender/recipient": "raj.patel@atlas.com",
                    "subject": "Q4", "sent_datetime": CURRENT_TIME, "body": "See you"}
    assert env.get(EMAILS).index[-1] == 500

    assert call_tool(env, "email_reply_email", {"email_id": "00000057", "body": "Thanks for the update"}) == (
        "Email replied successfully."
    )
    reply = rows(env, EMAILS, "email_id", "00000501").iloc[0]
    assert reply["sender/recipient"] == "carlos.rodriguez@atlas.com"
    assert reply["subject"] == "Task Update on Develop prototype for report generation"

    assert call_tool(env, "email_forward_email", {"email_id": "00000057", "recipient": "nadia.moreau@atlas.com"}) == (
        "Email forwarded successfully."
    )
    fwd = rows(env, EMAILS, "email_id", "00000502").iloc[0]
    assert fwd["subject"].startswith("FW: ") and fwd["body"] == rows(env, EMAILS, "email_id", "00000057")["body"].iloc[0]

    assert call_tool(env, "email_delete_email", {"email_id": "00000259"}) == "Email deleted successfully."
    assert rows(env, EMAILS, "email_id", "00000259").empty and len(env.get(EMAILS)) == 502
    assert call_tool(env, "email_delete_email", {"email_id": "00000259"}) == "Email not found."

    before = env.get(EMAILS)
    assert call_tool(env, "email_send_email", {"recipient": "nobody", "subject": "s", "body": "b"}) == "Invalid recipient email address."
    assert call_tool(env, "email_send_email", {"recipient": "a@b.c", "subject": "s"}) == "Recipient, subject, or body not provided."
    assert call_tool(env, "email_forward_email", {"email_id": "12345678", "recipient": "a@b.c"}) == "Email not found."
    assert call_tool(env, "email_reply_email", {"email_id": "00000057"}) == "Email ID or body not provided."
    assert env.get(EMAILS) is before  # failed calls change nothing


# --------------------------------------------------------------------------- calendar


def test_calendar_read_and_search(env: WorkplaceEnvironment) -> None:
    assert call_tool(env, "calendar_get_event_information_by_id", {"event_id": "00000252", "field": "event_name"}) == {
        "event_name": "brainstorming session"
    }
    assert call_tool(env, "calendar_get_event_information_by_id", {"event_id": "1", "field": "duration"}) == "Event not found."
    day = call_tool(env, "calendar_search_events",
                    {"time_min": "2023-12-01 00:00:00", "time_max": "2023-12-01 23:59:59", "page_size": 10})
    assert [e["event_id"] for e in day["events"]] == ["00000165", "00000091", "00000237", "00000093", "00000261", "00000252"]
    # time_min bounds the END of an event: the 15:00 two-hour event still counts at 16:30
    late = call_tool(env, "calendar_search_events",
                     {"time_min": "2023-12-01 16:30:00", "time_max": "2023-12-01 23:59:59"})
    assert [e["event_id"] for e in late["events"]] == ["00000252"]
    sync = call_tool(env, "calendar_search_events", {"query": "Sync Up luis"})
    assert sync["events"] and all(
        "sync up" in e["event_name"].lower() and "luis" in e["participant_email"] for e in sync["events"]
    )
    assert call_tool(env, "calendar_search_events", {"query": "zebra"}) == "No events found."


def test_calendar_create_update_delete(env: WorkplaceEnvironment) -> None:
    new_id = call_tool(env, "calendar_create_event", {"event_name": "Budget sync", "participant_email": "Luis.Ortiz@atlas.com",
                                                      "event_start": "2023-12-04 10:00:00", "duration": "30"})
    assert new_id == "00000300"
    created = rows(env, CALENDAR, "event_id", "00000300").iloc[0]
    assert created["participant_email"] == "luis.ortiz@atlas.com" and created["duration"] == "30"

    assert call_tool(env, "calendar_update_event", {"event_id": "00000252", "field": "event_name",
                                                    "new_value": "Risk Management Forum"}) == "Event updated successfully."
    assert rows(env, CALENDAR, "event_id", "00000252")["event_name"].iloc[0] == "Risk Management Forum"
    assert call_tool(env, "calendar_update_event", {"event_id": "00000252", "field": "event_id", "new_value": "1"}).startswith(
        "Field not valid."
    )
    assert call_tool(env, "calendar_update_event", {"event_id": "00000252", "field": "event_start",
                                                    "new_value": "tomorrow"}).startswith("Error executing tool 'calendar_update_event'")
    assert call_tool(env, "calendar_delete_event", {"event_id": "00000252"}) == "Event deleted successfully."
    assert call_tool(env, "calendar_delete_event", {"event_id": "00000252"}) == "Event not found."
    assert call_tool(env, "calendar_create_event", {"event_name": "x", "participant_email": "a@b.c",
                                                    "event_start": "2023-12-04 10:00", "duration": "30"}).startswith(
        "Error executing tool 'calendar_create_event': event_start must be a date and time"
    )
    assert call_tool(env, "calendar_create_event", {"event_name": "x"}) == "Participant email not provided."


# --------------------------------------------------------------------------- analytics


def test_analytics_counts(env: WorkplaceEnvironment) -> None:
    raw = pd.read_csv(DATA_DIR / "csv_data/processed/analytics_data.csv", dtype=str)
    nov1 = raw[raw["date_of_visit"] == "2023-11-01"]
    one_day = {"time_min": "2023-11-01", "time_max": "2023-11-01"}
    assert call_tool(env, "analytics_total_visits_count", one_day) == len(nov1) == 15
    assert call_tool(env, "analytics_engaged_users_count", one_day) == int((nov1["user_engaged"] == "True").sum()) == 5
    direct = int((nov1["traffic_source"] == "direct").sum())
    assert call_tool(env, "analytics_traffic_source_count", {**one_day, "traffic_source": "direct"}) == direct == 12
    assert call_tool(env, "analytics_get_average_session_duration", one_day) == pytest.approx(140 / 15)
    assert call_tool(env, "analytics_total_visits_count", {}) == 1000
    assert call_tool(env, "analytics_traffic_source_count", {"traffic_source": "email"}).startswith("Traffic source not valid.")
    assert call_tool(env, "analytics_get_average_session_duration", {"time_min": "2024-01-01"}) == (
        "No visits found in the given time range."
    )
    visits = call_tool(env, "analytics_get_visitor_information_by_id", {"visitor_id": "0860"})
    assert visits == [{"date_of_visit": "2023-10-22", "visitor_id": "0860", "page_views": "8",
                       "session_duration_seconds": "4", "traffic_source": "referral", "user_engaged": False}]
    assert call_tool(env, "analytics_get_visitor_information_by_id", {"visitor_id": "abcd"}) == "Visitor not found."


def test_analytics_create_plot_appends_by_label(env: WorkplaceEnvironment) -> None:
    args = {"time_min": "2023-11-30", "time_max": "2024-06-30", "value_to_plot": "total_visits", "plot_type": "bar"}
    assert call_tool(env, "analytics_create_plot", args) == "plots/2023-11-30_2024-06-30_total_visits_bar.png"
    call_tool(env, "analytics_create_plot", {**args, "plot_type": "line"})
    plots = env.get(PLOTS)
    assert list(plots.index) == [0, 1] and plots["file_path"].dtype == object
    assert plots["file_path"].iloc[1] == "plots/2023-11-30_2024-06-30_total_visits_line.png"
    assert call_tool(env, "analytics_create_plot", {**args, "plot_type": "pie"}).startswith("Plot type must be one of")
    assert call_tool(env, "analytics_create_plot", {**args, "value_to_plot": "revenue"}).startswith("Value to plot must be one of")
    assert call_tool(env, "analytics_create_plot", {"time_min": "2023-11-30"}) == "End date not provided."
    assert len(env.get(PLOTS)) == 2


# --------------------------------------------------------------------------- project management


def test_project_management(env: WorkplaceEnvironment) -> None:
    assert call_tool(env, "project_management_get_task_information_by_id", {"task_id": "00000149", "field": "board"}) == {
        "board": "Front end"
    }
    found = call_tool(env, "project_management_search_tasks", {"assigned_to_email": "leila", "list_name": "backlog"})
    assert found and all(t["assigned_to_email"] == "leila.azizi@atlas.com" and t["list_name"] == "Backlog" for t in found)
    assert call_tool(env, "project_management_search_tasks", {}) == "No search parameters provided."
    assert call_tool(env, "project_management_search_tasks", {"task_name": "quantum teleport"}) == "No tasks found."

    task_id = call_tool(env, "project_management_create_task", {
        "task_name": "Write launch notes", "assigned_to_email": "Leila.Azizi@atlas.com",
        "list_name": "Backlog", "due_date": "2023-12-08", "board": "Design"})
    assert task_id == "00000300"
    assert rows(env, TASKS, "task_id", task_id)["assigned_to_email"].iloc[0] == "leila.azizi@atlas.com"
    assert call_tool(env, "project_management_create_task", {
        "task_name": "x", "assigned_to_email": "ghost@atlas.com", "list_name": "Backlog",
        "due_date": "2023-12-08", "board": "Design"}) == "Assignee email not valid. Please choose from the list of team members."
    assert call_tool(env, "project_management_create_task", {
        "task_name": "x", "assigned_to_email": "raj.patel@atlas.com", "list_name": "Doing",
        "due_date": "2023-12-08", "board": "Design"}).startswith("List not valid.")
    assert call_tool(env, "project_management_create_task", {"task_name": "x"}) == "Missing task details."

    assert call_tool(env, "project_management_update_task", {"task_id": "00000149", "field": "list_name",
                                                             "new_value": "In Review"}) == "Task updated successfully."
    assert rows(env, TASKS, "task_id", "00000149")["list_name"].iloc[0] == "In Review"
    assert call_tool(env, "project_management_update_task", {"task_id": "00000149", "field": "board",
                                                             "new_value": "back end"}).startswith("Board not valid.")
    assert call_tool(env, "project_management_update_task", {"task_id": "404", "field": "task_name",
                                                             "new_value": "x"}) == "Task not found."
    assert call_tool(env, "project_management_delete_task", {"task_id": "00000037"}) == "Task deleted successfully."
    assert call_tool(env, "project_management_delete_task", {"task_id": "00000037"}) == "Task not found."


# --------------------------------------------------------------------------- CRM


def test_crm_search(env: WorkplaceEnvironment) -> None:
    out = call_tool(env, "customer_relationship_manager_search_customers", {"customer_name": "Casey Wilson", "page": 1, "page_size": 1})
    assert out == {
        "customers": [{"customer_id": "00000014", "assigned_to_email": "akira.sato@atlas.com", "customer_name": "Casey Wilson",
                       "customer_email": "casey.wilson@ultradynamics", "customer_phone": None,
                       "last_contact_date": "2023-10-09 23:59:00", "product_interest": "Hardware", "status": "Qualified",
                       "follow_up_by": "2023-10-29 23:59:00", "notes": "2023-10-18: Met in person. "}],
        "pagination": {"total_customers": 1, "page": 1, "page_size": 1, "total_pages": 1},
    }
    akira = call_tool(env, "customer_relationship_manager_search_customers",
                      {"assigned_to_email": "akira", "product_interest": "software", "page_size": 20})
    assert {c["customer_id"] for c in akira["customers"]} >= {"00000095", "00000080", "00000035"}
    dated = call_tool(env, "customer_relationship_manager_search_customers",
                      {"last_contact_date_min": "2023-11-30", "last_contact_date_max": "2023-11-30", "page_size": 200})
    assert dated["customers"] and all(c["last_contact_date"].startswith("2023-11-30") for c in dated["customers"])
    assert call_tool(env, "customer_relationship_manager_search_customers", {"page": 2}) == (
        "No search parameters provided. Please provide at least one parameter."
    )
    assert call_tool(env, "customer_relationship_manager_search_customers", {"customer_name": "Nobody Atall"}) == "No customers found."


def test_crm_add_update_delete(env: WorkplaceEnvironment) -> None:
    new_id = call_tool(env, "customer_relationship_manager_add_customer",
                       {"customer_name": "Dakota Thomas", "assigned_to_email": "Nadia.Moreau@atlas.com", "status": "Lead"})
    assert new_id == "00000200"
    row = rows(env, CRM, "customer_id", new_id).iloc[0]
    assert row["assigned_to_email"] == "nadia.moreau@atlas.com"
    assert row["customer_phone"] is None and row["notes"] is None  # None, not NaN
    assert env.get(CRM).index[-1] == 200
    assert call_tool(env, "customer_relationship_manager_add_customer",
                     {"customer_name": "x", "assigned_to_email": "a@b.c", "status": "Hot"}).startswith("Status not valid.")
    assert call_tool(env, "customer_relationship_manager_add_customer", {"customer_name": "x"}) == (
        "Please provide all required fields: customer_name, assigned_to_email, status."
    )

    assert call_tool(env, "customer_relationship_manager_update_customer",
                     {"customer_id": "00000095", "field": "assigned_to_email", "new_value": "Raj.Patel@atlas.com"}) == (
        "Customer updated successfully."
    )
    assert rows(env, CRM, "customer_id", "00000095")["assigned_to_email"].iloc[0] == "raj.patel@atlas.com"
    assert call_tool(env, "customer_relationship_manager_update_customer",
                     {"customer_id": "00000095", "field": "status", "new_value": "lost"}).startswith("Status not valid.")
    assert call_tool(env, "customer_relationship_manager_update_customer",
                     {"customer_id": "00000095", "field": "customer_id", "new_value": "1"}).startswith("Field not valid.")
    assert call_tool(env, "customer_relationship_manager_update_customer",
                     {"customer_id": "404", "field": "notes", "new_value": "x"}) == "Customer not found."
    assert call_tool(env, "customer_relationship_manager_delete_customer", {"customer_id": "00000014"}) == (
        "Customer deleted successfully."
    )
    assert call_tool(env, "customer_relationship_manager_delete_customer", {"customer_id": "00000014"}) == "Customer not found."


# --------------------------------------------------------------------------- determinism


def test_same_calls_give_same_outputs_and_tables() -> None:
    calls = [
        ("email_send_email", {"recipient": "raj.patel@atlas.com", "subject": "a", "body": "b"}),
        ("calendar_create_event", {"event_name": "n", "participant_email": "raj.patel@atlas.com",
                                   "event_start": "2023-12-04 10:00:00", "duration": "60"}),
        ("customer_relationship_manager_add_customer", {"customer_name": "c", "assigned_to_email": "raj.patel@atlas.com", "status": "Won"}),
        ("email_search_emails", {"query": "raj"}),
    ]
    runs = []
    for _ in range(2):
        env = WorkplaceEnvironment.fresh()
        outputs = [json.dumps(call_tool(env, n, a), sort_keys=True) for n, a in calls]
        runs.append((outputs, {k: df for k, df in env.items()}))
    assert runs[0][0] == runs[1][0]
    for key in TABLE_KEYS:
        pd.testing.assert_frame_equal(runs[0][1][key], runs[1][1][key], check_exact=True)


def test_ids_come_from_table_contents(env: WorkplaceEnvironment) -> None:
    call_tool(env, "calendar_delete_event", {"event_id": "00000299"})  # the largest ID
    assert call_tool(env, "calendar_create_event", {"event_name": "n", "participant_email": "raj.patel@atlas.com",
                                                    "event_start": "2023-12-04 10:00:00", "duration": "60"}) == "00000299"
    assert env.get(CALENDAR).index[-1] == 300  # a new label past the largest, never a reused one
