"""Shared scenarios for the codec and session tests."""

from __future__ import annotations

import json
from typing import Any

from gym_services.resources.workplace_assistant.environment import WorkplaceEnvironment
from gym_services.resources.workplace_assistant.tools import call_tool

Call = tuple[str, dict[str, Any]]

#: Mutations by kind; each list runs on a fresh session.
SCENARIOS: dict[str, list[Call]] = {
    "send_email": [
        ("email_send_email", {"recipient": "raj.patel@atlas.com", "subject": "Q4 plan", "body": "Draft attached."})
    ],
    "delete_email": [("email_delete_email", {"email_id": "00000259"})],
    "forward_email": [("email_forward_email", {"email_id": "00000057", "recipient": "nadia.moreau@atlas.com"})],
    "reply_email": [("email_reply_email", {"email_id": "00000057", "body": "Thanks - tomorrow."})],
    "create_event": [
        (
            "calendar_create_event",
            {
                "event_name": "Budget sync",
                "participant_email": "luis.ortiz@atlas.com",
                "event_start": "2023-12-04 10:00:00",
                "duration": "30",
            },
        )
    ],
    "update_event": [
        ("calendar_update_event", {"event_id": "00000252", "field": "event_name", "new_value": "Risk Management Forum"})
    ],
    "delete_event": [("calendar_delete_event", {"event_id": "00000013"})],
    "delete_first_event": [
        ("calendar_delete_event", {"event_id": "00000013"}),
        ("calendar_delete_event", {"event_id": "00000275"}),
    ],
    "create_plot": [
        (
            "analytics_create_plot",
            {"time_min": "2023-11-01", "time_max": "2023-11-30", "value_to_plot": "user_engaged", "plot_type": "line"},
        )
    ]
    * 2,
    "tasks": [
        (
            "project_management_create_task",
            {
                "task_name": "Launch notes",
                "assigned_to_email": "leila.azizi@atlas.com",
                "list_name": "Backlog",
                "due_date": "2023-12-08",
                "board": "Design",
            },
        ),
        ("project_management_update_task", {"task_id": "00000149", "field": "list_name", "new_value": "In Review"}),
        ("project_management_delete_task", {"task_id": "00000037"}),
    ],
    "crm": [
        (
            "customer_relationship_manager_add_customer",
            {"customer_name": "Dakota Thomas", "assigned_to_email": "nadia.moreau@atlas.com", "status": "Lead"},
        ),
        (
            "customer_relationship_manager_update_customer",
            {"customer_id": "00000189", "field": "customer_phone", "new_value": "555-0100"},
        ),
        (
            "customer_relationship_manager_update_customer",
            {"customer_id": "00000095", "field": "status", "new_value": "Won"},
        ),
        ("customer_relationship_manager_delete_customer", {"customer_id": "00000014"}),
    ],
    "delete_then_send": [
        ("email_delete_email", {"email_id": "00000499"}),
        ("email_send_email", {"recipient": "raj.patel@atlas.com", "subject": "s", "body": "b"}),
    ],
}
SCENARIOS["everything"] = [call for calls in SCENARIOS.values() for call in calls]

#: Calls run after a restore to check the restored session answers exactly like the original.
FOLLOW_UPS: list[Call] = [
    ("email_search_emails", {"query": "raj", "page_size": 10}),
    ("email_send_email", {"recipient": "aisha.chen@atlas.com", "subject": "after", "body": "restore"}),
    ("calendar_search_events", {"time_min": "2023-12-01 00:00:00", "page_size": 50}),
    (
        "project_management_create_task",
        {
            "task_name": "Post",
            "assigned_to_email": "raj.patel@atlas.com",
            "list_name": "Completed",
            "due_date": "2023-12-09",
            "board": "Back end",
        },
    ),
    ("customer_relationship_manager_search_customers", {"assigned_to_email": "nadia", "page_size": 100}),
    (
        "customer_relationship_manager_add_customer",
        {"customer_name": "After", "assigned_to_email": "raj.patel@atlas.com", "status": "Won", "notes": "n"},
    ),
    (
        "analytics_create_plot",
        {"time_min": "2023-11-01", "time_max": "2023-11-02", "value_to_plot": "total_visits", "plot_type": "bar"},
    ),
]


def run(env: WorkplaceEnvironment, calls: list[Call]) -> list[str]:
    return [json.dumps(call_tool(env, name, args), sort_keys=True) for name, args in calls]


def json_round_trip(obj: Any) -> Any:
    return json.loads(json.dumps(obj))
