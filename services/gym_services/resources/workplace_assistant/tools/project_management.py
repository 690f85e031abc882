"""Project management toolkit over the session's ``_project_tasks``.

Assignees must already appear in the table (compared lowercased); list and board names are fixed.
Searches match ``task_name``, ``list_name``, ``due_date`` and ``board`` as case-insensitive regular
expressions and the assignee exactly (ignoring case). ``update_task`` may change any column,
``task_id`` included.
"""

from __future__ import annotations

import re
from typing import ClassVar

import pandas as pd

from ..environment import TASKS
from ._common import SessionTable, Toolkit

LISTS = ["Backlog", "In Progress", "In Review", "Completed"]
BOARDS = ["Back end", "Front end", "Design"]
BAD_LIST = "List not valid. Please choose from: 'Backlog', 'In Progress', 'In Review', 'Completed'."
BAD_BOARD = "Board not valid. Please choose from: 'Back end', 'Front end', 'Design'."
BAD_ASSIGNEE = "Assignee email not valid. Please choose from the list of team members."
EMAIL_SHAPE = re.compile(r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$")


class ProjectManagementTool(Toolkit):
    TOOLS: ClassVar[dict[str, str]] = {
        "project_management_get_task_information_by_id": "get_task_information_by_id",
        "project_management_search_tasks": "search_tasks",
        "project_management_create_task": "create_task",
        "project_management_delete_task": "delete_task",
        "project_management_update_task": "update_task",
    }

    _project_tasks = SessionTable(TASKS)

    def _is_member(self, address) -> bool:
        return address in self._project_tasks["assigned_to_email"].str.lower().values

    def get_task_information_by_id(self, task_id=None, field=None):
        if not task_id:
            return "Task ID not provided."
        if not field:
            return "Field not provided."
        table = self._project_tasks
        found = table[table["task_id"] == task_id].to_dict(orient="records")
        if not found:
            return "Task not found."
        return {field: found[0][field]} if field in found[0] else "Field not found."

    def search_tasks(self, task_name=None, assigned_to_email=None, list_name=None, due_date=None, board=None):
        if not any([task_name, assigned_to_email, list_name, due_date, board]):
            return "No search parameters provided."
        if assigned_to_email and not EMAIL_SHAPE.match(assigned_to_email):
            return "Invalid email format for assigned_to_email."
        tasks = self._project_tasks.copy()

        def containing(frame, column, pattern):
            return frame[frame[column].str.contains(pattern, case=False)]

        if task_name:
            tasks = containing(tasks, "task_name", task_name)
        if assigned_to_email:
            tasks = tasks[tasks["assigned_to_email"].str.lower() == assigned_to_email.lower()]
        if list_name:
            tasks = containing(tasks, "list_name", list_name)
        if due_date:
            tasks = containing(tasks, "due_date", due_date)
        if board:
            tasks = containing(tasks, "board", board)
        return tasks.to_dict(orient="records")

    def create_task(self, task_name=None, assigned_to_email=None, list_name=None, due_date=None, board=None):
        if not all([task_name, assigned_to_email, list_name, due_date, board]):
            return "Missing task details."
        assigned_to_email = assigned_to_email.lower()
        if not self._is_member(assigned_to_email):
            return BAD_ASSIGNEE
        if list_name not in LISTS:
            return BAD_LIST
        if board not in BOARDS:
            return BAD_BOARD
        table = self._project_tasks
        new_id = str(int(table["task_id"].max()) + 1).zfill(8)
        row = pd.DataFrame(
            {
                "task_id": [new_id],
                "task_name": [task_name],
                "assigned_to_email": [assigned_to_email],
                "list_name": [list_name],
                "due_date": [due_date],
                "board": [board],
            }
        )
        self._project_tasks = pd.concat([table, row], ignore_index=True)
        return new_id

    def delete_task(self, task_id=None):
        if not task_id:
            return "Task ID not provided."
        table = self._project_tasks
        if task_id not in table["task_id"].values:
            return "Task not found."
        self._project_tasks = table[table["task_id"] != task_id]
        return "Task deleted successfully."

    def update_task(self, task_id=None, field=None, new_value=None):
        if not task_id or not field or not new_value:
            return "Task ID, field, or new value not provided."
        if field == "assigned_to_email":
            new_value = new_value.lower()
        if field == "board" and new_value not in BOARDS:
            return BAD_BOARD
        if field == "list_name" and new_value not in LISTS:
            return BAD_LIST
        if field == "assigned_to_email" and not self._is_member(new_value):
            return BAD_ASSIGNEE
        table = self._project_tasks
        if task_id not in table["task_id"].values:
            return "Task not found."
        if field not in table.columns:
            return "Field not valid."
        table.loc[table["task_id"] == task_id, field] = new_value
        return "Task updated successfully."
