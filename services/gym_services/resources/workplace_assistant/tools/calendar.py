"""Calendar toolkit over the session's ``_calendar_events``.

Event IDs must be 8-digit strings. Searches match the query as a case-insensitive regular expression
in the name or the participant, list the newest start first and bound by start time (``time_min`` /
``time_max``, anything ``pd.Timestamp`` reads). A created event is appended without renumbering the
index, so its label repeats an existing one (the first is 0).
"""

from __future__ import annotations

from typing import ClassVar

import pandas as pd

from ..environment import CALENDAR
from ._common import SessionTable, Toolkit, page_of, paginated

READABLE = ["event_id", "event_name", "participant_email", "event_start", "duration"]
WRITABLE = ["event_name", "participant_email", "event_start", "duration"]

BAD_ID = "Invalid event ID format. Expected 8-digit ID."
BAD_START = "Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS."


def _is_event_id(value) -> bool:
    return isinstance(value, str) and len(value) == 8 and value.isdigit()


def _bad_duration(value) -> str | None:
    """The answer for a duration that is not a positive whole number of minutes, else None."""
    try:
        if int(value) <= 0:
            return "Duration must be a positive number of minutes."
    except ValueError:
        return "Invalid duration format. Expected a number of minutes."
    return None


def _bad_start(value) -> bool:
    try:
        pd.Timestamp(value)
    except ValueError:
        return True
    return False


class CalendarTool(Toolkit):
    TOOLS: ClassVar[dict[str, str]] = {
        "calendar_get_event_information_by_id": "get_event_information_by_id",
        "calendar_search_events": "search_events",
        "calendar_create_event": "create_event",
        "calendar_delete_event": "delete_event",
        "calendar_update_event": "update_event",
    }

    _calendar_events = SessionTable(CALENDAR)

    def get_event_information_by_id(self, event_id=None, field=None):
        if not event_id:
            return "Event ID not provided."
        if not field:
            return "Field not provided."
        if not _is_event_id(event_id):
            return BAD_ID
        if field not in READABLE:
            return f"Invalid field. Available fields are: {', '.join(READABLE)}"
        table = self._calendar_events
        found = table[table["event_id"] == event_id].to_dict(orient="records")
        if not found:
            return "Event not found."
        return {field: found[0][field]} if field in found[0] else "Field not found."

    def search_events(self, query="", time_min=None, time_max=None, page=1, page_size=5):
        if time_min:
            try:
                time_min = pd.Timestamp(time_min)
            except ValueError:
                return "Invalid time_min format. Expected YYYY-MM-DD HH:MM:SS."
        if time_max:
            try:
                time_max = pd.Timestamp(time_max)
            except ValueError:
                return "Invalid time_max format. Expected YYYY-MM-DD HH:MM:SS."
        table = self._calendar_events
        in_name = table["event_name"].str.contains(query, case=False, na=False)
        in_participant = table["participant_email"].str.contains(query, case=False, na=False)
        found = table[in_name | in_participant].to_dict(orient="records")

        def start(event):
            return pd.Timestamp(event["event_start"])

        if time_min:
            found = [e for e in found if start(e) >= time_min]
        if time_max:
            found = [e for e in found if start(e) <= time_max]
        if not found:
            return "No events found."
        found.sort(key=start, reverse=True)  # newest first; equal starts keep table order
        return paginated("events", found, page_of(len(found), page, page_size))

    def create_event(self, event_name=None, participant_email=None, event_start=None, duration=None):
        missing = [
            (event_name, "Event name not provided."),
            (participant_email, "Participant email not provided."),
            (event_start, "Event start not provided."),
            (duration, "Event duration not provided."),
        ]
        for value, answer in missing:
            if not value:
                return answer
        if _bad_start(event_start):
            return BAD_START
        problem = _bad_duration(duration)
        if problem:
            return problem
        participant_email = participant_email.lower()
        table = self._calendar_events
        new_id = str(int(table["event_id"].max()) + 1).zfill(8)
        row = pd.DataFrame(
            {
                "event_id": [new_id],
                "event_name": [event_name],
                "participant_email": [participant_email],
                "event_start": [event_start],
                "duration": [duration],
            }
        )
        self._calendar_events = pd.concat([table, row])
        return new_id

    def delete_event(self, event_id=None):
        if not event_id:
            return "Event ID not provided."
        if not _is_event_id(event_id):
            return BAD_ID
        table = self._calendar_events
        if event_id not in table["event_id"].values:
            return "Event not found."
        self._calendar_events = table[table["event_id"] != event_id]
        return "Event deleted successfully."

    def update_event(self, event_id=None, field=None, new_value=None):
        if not event_id or not field or not new_value:
            return "Event ID, field, or new value not provided."
        if not _is_event_id(event_id):
            return BAD_ID
        if field not in WRITABLE:
            return f"Invalid field. Available fields are: {', '.join(WRITABLE)}"
        if field == "event_start" and _bad_start(new_value):
            return BAD_START
        if field == "duration":
            problem = _bad_duration(new_value)
            if problem:
                return problem
        table = self._calendar_events
        if event_id not in table["event_id"].values:
            return "Event not found."
        if field == "participant_email":
            new_value = new_value.lower()
        table.loc[table["event_id"] == event_id, field] = new_value
        return "Event updated successfully."
