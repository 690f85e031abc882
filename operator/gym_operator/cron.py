"""When a CheckpointSchedule fires: standard 5-field cron expressions, ``@every <duration>`` and the descriptors.

``spec.schedule`` of a CheckpointSchedule is one of (the forms Velero's Schedule and Kubernetes' CronJob take):

- five fields, ``minute hour day-of-month month day-of-week``, each ``*``, a value, a range ``a-b``, a step
  ``*/n``, ``a-b/n`` or ``a/n`` (from ``a`` to the field's end), or a comma-separated list of those; months may be
  named ``JAN``-``DEC`` and days ``SUN``-``SAT`` (any case); day-of-week 0 and 7 are both Sunday. When both day
  fields are restricted (neither starts with ``*``), a day matches if either does, as in Vixie cron;
- a descriptor: ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``), ``@hourly``;
- ``@every <duration>``: a fixed interval (``@every 10m``, ``@every 1h30m``, ``@every 90s``), counted from the
  schedule's last run (or its creation).

Times are UTC. :func:`parse` raises :class:`CronError` naming the field that is wrong; an expression that can
never fire (``0 0 30 2 *``) is refused too.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

#: (name, lowest, highest) of the five fields
FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12), ("day-of-week", 0, 7))
_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
MONTHS = {m: i + 1 for i, m in enumerate(_MONTH_NAMES)}
DAYS = {d: i for i, d in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
#: how far ahead :meth:`Cron.next_after` looks: every day-of-month/month/day-of-week combination recurs within
#: 28 years (the Gregorian weekday cycle of leap days)
HORIZON = dt.timedelta(days=366 * 29)


class CronError(ValueError):
    """An expression that is not a schedule; the message says which part and why."""


@dataclass(frozen=True)
class Cron:
    """A parsed 5-field expression: the allowed values of each field."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    #: both day fields restricted: a day matches if either does
    either_day: bool

    def _day_matches(self, day: dt.datetime) -> bool:
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        return (in_month or in_week) if self.either_day else (in_month and in_week)

    def next_after(self, after: dt.datetime) -> dt.datetime:
        """The first minute strictly after ``after`` (aware, any zone; the answer is UTC) that the expression
        matches."""
        t = after.astimezone(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        end = t + HORIZON
        while t < end:
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0) + dt.timedelta(days=32)).replace(day=1)
            elif not self._day_matches(t):
                t = t.replace(hour=0, minute=0) + dt.timedelta(days=1)
            elif t.hour not in self.hours:
                t = t.replace(minute=0) + dt.timedelta(hours=1)
            elif t.minute not in self.minutes:
                t += dt.timedelta(minutes=1)
            else:
                return t
        raise CronError("the expression never fires")


@dataclass(frozen=True)
class Every:
    """``@every <duration>``: a fixed interval."""

    interval: dt.timedelta

    def next_after(self, after: dt.datetime) -> dt.datetime:
        return after.astimezone(dt.UTC) + self.interval


Schedule = Cron | Every


def parse_interval(text: str) -> dt.timedelta:
    """``1h30m``, ``10m``, ``90s``: hours, minutes, seconds, each optional, in that order, more than zero."""
    match = _DURATION.match(text)
    if not text or match is None:
        raise CronError(f"@every {text!r}: not a duration like 10m, 1h30m or 90s")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    interval = dt.timedelta(hours=hours, minutes=minutes, seconds=seconds)
    if interval <= dt.timedelta(0):
        raise CronError(f"@every {text}: the interval must be longer than zero")
    return interval


def _value(text: str, name: str, low: int, high: int) -> int:
    names = MONTHS if name == "month" else DAYS if name == "day-of-week" else {}
    if text.upper() in names:
        return names[text.upper()]
    if not text.isdigit():
        raise CronError(f"{name} {text!r}: not a number" + (" or a name" if names else ""))
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{name} {value}: out of range {low}-{high}")
    return value


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{name} {text!r}: an empty list item")
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{name} {part!r}: the step must be a number above 0")
            step = int(step_text)
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            first, last = _value(a, name, low, high), _value(b, name, low, high)
            if first > last:
                raise CronError(f"{name} {part!r}: the range runs backwards")
        else:
            first = _value(base, name, low, high)
            last = high if step_text else first
        values.update(range(first, last + 1, step))
    return frozenset(values)


def parse(expression: str) -> Schedule:
    """A schedule from ``spec.schedule``; :class:`CronError` says what is wrong."""
    text = " ".join(expression.split())
    if text.startswith("@every"):
        return Every(parse_interval(text[len("@every") :].strip()))
    if text.startswith("@"):
        if text.lower() not in DESCRIPTORS:
            raise CronError(f"{text!r}: not one of {', '.join(sorted(DESCRIPTORS))} or @every <duration>")
        text = DESCRIPTORS[text.lower()]
    parts = text.split(" ")
    if len(parts) != 5:
        raise CronError(
            f"{expression!r}: {len(parts)} fields; a cron expression has 5 (minute hour day-of-month month "
            "day-of-week), e.g. '*/15 * * * *'"
        )
    fields = [_field(part, *spec) for part, spec in zip(parts, FIELDS, strict=True)]
    minutes, hours, days, months, weekdays = fields
    cron = Cron(
        minutes=minutes,
        hours=hours,
        days=days,
        months=months,
        weekdays=frozenset(d % 7 for d in weekdays),
        either_day=not parts[2].startswith("*") and not parts[4].startswith("*"),
    )
    cron.next_after(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))  # refuses one that never fires (Feb 30)
    return cron


def shortest_interval(schedule: Schedule, after: dt.datetime) -> dt.timedelta:
    """The shortest gap between two runs in the year after ``after`` (a cron's is at least a minute)."""
    if isinstance(schedule, Every):
        return schedule.interval
    shortest = dt.timedelta(days=366)
    t = schedule.next_after(after)
    end = t + dt.timedelta(days=366)
    for _ in range(2000):  # enough to see every gap of a schedule that fires at most every few hours ...
        nxt = schedule.next_after(t)
        shortest = min(shortest, nxt - t)
        if nxt > end or shortest <= dt.timedelta(minutes=1):
            break
        t = nxt
    return shortest
