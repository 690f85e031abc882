"""Calendar toolkit: read, search, create, delete and update events in ``_calendar_events``."""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from ..environment import CALENDAR, WorkplaceEnvironment
from ._common import (
    ToolError,
    append_row,
    delete_by_id,
    field_by_id,
    match_mask,
    next_id,
    next_label,
    paginate,
    parse_datetime,
    records,
)

EVENT_FIELDS = ("event_id", "event_name", "participant_email", "event_start", "duration")
UPDATABLE_FIELDS = ("event_name", "participant_email", "event_start", "duration")


def _check_duration(duration: str) -> None:
    if not duration.isdigit() or int(duration) <= 0:
        raise ToolError(f"duration must be a positive whole number of minutes, got {duration!r}")


def calendar_get_event_information_by_id(
    env: WorkplaceEnvironment, event_id: str | None = None, field: str | None = None
) -> object:
    return field_by_id(env.get(CALENDAR), "event_id", event_id, field, EVENT_FIELDS, "Event")


def calendar_search_events(
    env: WorkplaceEnvironment,
    query: str = "",
    time_min: str | None = None,
    time_max: str | None = None,
    page: int = 1,
    page_size: int = 5,
) -> object:
    """Events whose name or participant contain every query term, by start time.

    As the tool description says, ``time_min`` bounds an event's end (start + duration) and
    ``time_max`` bounds its start, both inclusive.
    """
    events = env.get(CALENDAR)
    terms = query.lower().split()
    lo = parse_datetime(time_min, "time_min") if time_min else None
    hi = parse_datetime(time_max, "time_max") if time_max else None
    keep = np.zeros(len(events), dtype=bool)
    for i, (name, who, start, duration) in enumerate(
        zip(
            events["event_name"].to_numpy(),
            events["participant_email"].to_numpy(),
            events["event_start"].to_numpy(),
            events["duration"].to_numpy(),
            strict=True,
        )
    ):
        text = " ".join(v for v in (name, who) if isinstance(v, str)).lower()
        if not all(t in text for t in terms):
            continue
        if lo is not None or hi is not None:
            begin = parse_datetime(start, "event_start")
            if hi is not None and begin > hi:
                continue
            if lo is not None:
                minutes = int(duration) if isinstance(duration, str) and duration.isdigit() else 0
                if begin + timedelta(minutes=minutes) < lo:
                    continue
        keep[i] = True
    found = events[keep]
    if found.empty:
        return "No events found."
    found = found.sort_values("event_start", kind="stable")
    return paginate(records(found), page, page_size, "events")


def calendar_create_event(
    env: WorkplaceEnvironment,
    event_name: str | None = None,
    participant_email: str | None = None,
    event_start: str | None = None,
    duration: str | None = None,
) -> object:
    if not event_name:
        return "Event name not provided."
    if not participant_email:
        return "Participant email not provided."
    if not event_start:
        return "Event start not provided."
    if not duration:
        return "Event duration not provided."
    parse_datetime(event_start, "event_start")
    _check_duration(duration)
    events = env.get(CALENDAR)
    event_id = next_id(events, "event_id")
    row = {
        "event_id": event_id,
        "event_name": event_name,
        "participant_email": participant_email.lower(),
        "event_start": event_start,
        "duration": duration,
    }
    env.put(CALENDAR, append_row(events, next_label(events), row))
    return event_id


def calendar_delete_event(env: WorkplaceEnvironment, event_id: str | None = None) -> object:
    return delete_by_id(env, CALENDAR, "event_id", event_id, "Event")


def calendar_update_event(
    env: WorkplaceEnvironment,
    event_id: str | None = None,
    field: str | None = None,
    new_value: str | None = None,
) -> object:
    if not event_id or not field or not new_value:
        return "Event ID, field, or new value not provided."
    if field not in UPDATABLE_FIELDS:
        options = ", ".join(f"'{f}'" for f in UPDATABLE_FIELDS)
        return f"Field not valid. Please choose from: {options}."
    events = env.get(CALENDAR)
    hit = match_mask(events, "event_id", event_id)
    if not hit.any():
        return "Event not found."
    if field == "participant_email":
        new_value = new_value.lower()
    elif field == "event_start":
        parse_datetime(new_value, "event_start")
    elif field == "duration":
        _check_duration(new_value)
    events.loc[hit, field] = new_value
    return "Event updated successfully."


TOOLS = {
    "calendar_get_event_information_by_id": calendar_get_event_information_by_id,
    "calendar_search_events": calendar_search_events,
    "calendar_create_event": calendar_create_event,
    "calendar_delete_event": calendar_delete_event,
    "calendar_update_event": calendar_update_event,
}
