"""Project management toolkit: read, search, create, delete and update ``_project_tasks``."""

from __future__ import annotations

import numpy as np

from ..environment import DIRECTORY, TASKS, WorkplaceEnvironment
from ._common import (
    append_row,
    choice_error,
    contains_ci,
    delete_by_id,
    field_by_id,
    match_mask,
    next_id,
    next_label,
    parse_date,
    records,
)

TASK_FIELDS = ("task_id", "task_name", "assigned_to_email", "list_name", "due_date", "board")
UPDATABLE_FIELDS = ("task_name", "assigned_to_email", "list_name", "due_date", "board")
LIST_NAMES = ("Backlog", "In Progress", "In Review", "Completed")
BOARDS = ("Back end", "Front end", "Design")
_ASSIGNEE_ERROR = "Assignee email not valid. Please choose from the list of team members."


def _is_team_member(env: WorkplaceEnvironment, email: str) -> bool:
    return email in set(env.get(DIRECTORY)["email_address"].to_numpy())


def project_management_get_task_information_by_id(
    env: WorkplaceEnvironment, task_id: str | None = None, field: str | None = None
) -> object:
    return field_by_id(env.get(TASKS), "task_id", task_id, field, TASK_FIELDS, "Task")


def project_management_search_tasks(
    env: WorkplaceEnvironment,
    task_name: str | None = None,
    assigned_to_email: str | None = None,
    list_name: str | None = None,
    due_date: str | None = None,
    board: str | None = None,
) -> object:
    """Tasks matching every given parameter (case-insensitive substring), in table order."""
    filters = {
        "task_name": task_name,
        "assigned_to_email": assigned_to_email,
        "list_name": list_name,
        "due_date": due_date,
        "board": board,
    }
    if not any(filters.values()):
        return "No search parameters provided."
    tasks = env.get(TASKS)
    keep = np.ones(len(tasks), dtype=bool)
    for column, value in filters.items():
        if value:
            keep &= contains_ci(tasks[column], value)
    found = tasks[keep]
    if found.empty:
        return "No tasks found."
    return records(found)


def project_management_create_task(
    env: WorkplaceEnvironment,
    task_name: str | None = None,
    assigned_to_email: str | None = None,
    list_name: str | None = None,
    due_date: str | None = None,
    board: str | None = None,
) -> object:
    if not task_name or not assigned_to_email or not list_name or not due_date or not board:
        return "Missing task details."
    assigned_to_email = assigned_to_email.lower()
    if not _is_team_member(env, assigned_to_email):
        return _ASSIGNEE_ERROR
    problem = choice_error(list_name, LIST_NAMES, "List") or choice_error(board, BOARDS, "Board")
    if problem:
        return problem
    parse_date(due_date, "due_date")
    tasks = env.get(TASKS)
    task_id = next_id(tasks, "task_id")
    row = {
        "task_id": task_id,
        "task_name": task_name,
        "assigned_to_email": assigned_to_email,
        "list_name": list_name,
        "due_date": due_date,
        "board": board,
    }
    env.put(TASKS, append_row(tasks, next_label(tasks), row))
    return task_id


def project_management_delete_task(env: WorkplaceEnvironment, task_id: str | None = None) -> object:
    return delete_by_id(env, TASKS, "task_id", task_id, "Task")


def project_management_update_task(
    env: WorkplaceEnvironment,
    task_id: str | None = None,
    field: str | None = None,
    new_value: str | None = None,
) -> object:
    if not task_id or not field or not new_value:
        return "Task ID, field, or new value not provided."
    if field not in UPDATABLE_FIELDS:
        options = ", ".join(f"'{f}'" for f in UPDATABLE_FIELDS)
        return f"Field not valid. Please choose from: {options}."
    if field == "assigned_to_email":
        new_value = new_value.lower()
        if not _is_team_member(env, new_value):
            return _ASSIGNEE_ERROR
    problem = None
    if field == "list_name":
        problem = choice_error(new_value, LIST_NAMES, "List")
    elif field == "board":
        problem = choice_error(new_value, BOARDS, "Board")
    elif field == "due_date":
        parse_date(new_value, "due_date")
    if problem:
        return problem
    tasks = env.get(TASKS)
    hit = match_mask(tasks, "task_id", task_id)
    if not hit.any():
        return "Task not found."
    tasks.loc[hit, field] = new_value
    return "Task updated successfully."


TOOLS = {
    "project_management_get_task_information_by_id": project_management_get_task_information_by_id,
    "project_management_search_tasks": project_management_search_tasks,
    "project_management_create_task": project_management_create_task,
    "project_management_delete_task": project_management_delete_task,
    "project_management_update_task": project_management_update_task,
}
