"""CheckpointSchedule's cron expressions (gym_operator/cron.py): what Vixie cron and Kubernetes' CronJob accept, the
next run, and a clear refusal naming what is wrong."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from gym_operator import cron

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def brute_force(expression: str, after: dt.datetime, until: dt.datetime) -> dt.datetime | None:
    """The next match up to ``until``, minute by minute, reading the fields directly (a second implementation to
    compare with)."""
    minute, hour, dom, month, dow = expression.split()
    names = {n: i for i, n in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
    names |= {
        n: i + 1
        for i, n in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])
    }

    def allowed(field: str, low: int, high: int) -> set[int]:
        values: set[int] = set()
        for part in field.split(","):
            base, _, step = part.partition("/")
            if base == "*":
                lo, hi = low, high
            elif "-" in base:
                a, b = base.split("-")
                lo, hi = int(names.get(a.lower(), a)), int(names.get(b.lower(), b))
            else:
                lo = int(names.get(base.lower(), base))
                hi = high if step else lo
            values |= set(range(lo, hi + 1, int(step or 1)))
        return values

    minutes, hours, days, months = (
        allowed(minute, 0, 59),
        allowed(hour, 0, 23),
        allowed(dom, 1, 31),
        allowed(month, 1, 12),
    )
    weekdays = {d % 7 for d in allowed(dow, 0, 7)}
    either = not dom.startswith("*") and not dow.startswith("*")
    t = after.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    while t <= until:
        in_month, in_week = t.day in days, t.isoweekday() % 7 in weekdays
        day = (in_month or in_week) if either else (in_month and in_week)
        if day and t.month in months and t.hour in hours and t.minute in minutes:
            return t
        t += dt.timedelta(minutes=1)
    return None


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("*/15 * * * *", "2026-03-01T10:07:30", "2026-03-01T10:15:00"),
        ("0 * * * *", "2026-03-01T10:00:00", "2026-03-01T11:00:00"),  # strictly after
        ("30 2 * * *", "2026-12-31T23:59:00", "2027-01-01T02:30:00"),
        ("0 0 29 2 *", "2025-03-01T00:00:00", "2028-02-29T00:00:00"),  # the next leap day
        ("0 9 * * MON-FRI", "2026-03-06T09:00:00", "2026-03-09T09:00:00"),  # Friday -> Monday
        ("0 0 * * 7", "2026-03-02T00:00:00", "2026-03-08T00:00:00"),  # 7 is Sunday too
        ("0 0 13 * FRI", "2026-03-01T00:00:00", "2026-03-06T00:00:00"),  # either day field (Vixie cron)
        ("0 0 */10 * *", "2026-03-01T00:00:00", "2026-03-11T00:00:00"),  # dom 1, 11, 21, 31 (only dom restricted)
        ("5/20 1-3 * jan,Jul *", "2026-02-01T00:00:00", "2026-07-01T01:05:00"),
        ("@hourly", "2026-03-01T10:00:00", "2026-03-01T11:00:00"),
        ("@weekly", "2026-03-01T00:00:00", "2026-03-08T00:00:00"),  # 2026-03-01 is a Sunday
        ("@yearly", "2026-03-01T00:00:00", "2027-01-01T00:00:00"),
    ],
)
def test_next_run(expression: str, after: str, expected: str) -> None:
    assert cron.parse(expression).next_after(at(after)) == at(expected)


def test_next_run_agrees_with_a_minute_by_minute_search() -> None:
    rng = random.Random(38)
    fields = [
        ["*", "*/7", "0", "15,45", "10-20/5", "59"],
        ["*", "*/5", "0", "9-17", "23", "6/6"],
        ["*", "1", "15", "28-31", "*/10", "1,15"],
        ["*", "*/3", "jan-mar", "6,7", "*/2"],  # (each a few months apart at most: the search stays short)
        ["*", "0", "1-5", "sat,sun", "*/2", "5"],
    ]
    for _ in range(30):
        expression = " ".join(rng.choice(options) for options in fields)
        after = at("2026-01-01T00:00:00") + dt.timedelta(minutes=rng.randrange(2 * 365 * 24 * 60))
        try:
            found = cron.parse(expression).next_after(after)
        except cron.CronError:  # (day 30 or 31 of February only: never; see the refusals below)
            continue
        # the search up to what the parser found: an earlier match, or none at all, would differ
        assert brute_force(expression, after, found) == found, expression


def test_every_counts_from_the_last_run() -> None:
    every = cron.parse("@every 1h30m")
    assert every == cron.Every(dt.timedelta(hours=1, minutes=30))
    assert every.next_after(at("2026-03-01T10:00:07")) == at("2026-03-01T11:30:07")


def test_shortest_interval() -> None:
    now = at("2026-03-01T00:00:00")
    assert cron.shortest_interval(cron.parse("@every 90s"), now) == dt.timedelta(seconds=90)
    assert cron.shortest_interval(cron.parse("*/15 * * * *"), now) == dt.timedelta(minutes=15)
    assert cron.shortest_interval(cron.parse("0,1 */6 * * *"), now) == dt.timedelta(minutes=1)
    assert cron.shortest_interval(cron.parse("0 3 * * *"), now) == dt.timedelta(days=1)


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("* * * *", "4 fields; a cron expression has 5"),
        ("60 * * * *", "minute 60: out of range 0-59"),
        ("* 24 * * *", "hour 24: out of range 0-23"),
        ("* * 0 * *", "day-of-month 0: out of range 1-31"),
        ("* * * 13 *", "month 13: out of range 1-12"),
        ("* * * * 8", "day-of-week 8: out of range 0-7"),
        ("*/0 * * * *", "the step must be a number above 0"),
        ("5-1 * * * *", "the range runs backwards"),
        ("* * * FOO *", "month 'FOO': not a number or a name"),
        ("1,,2 * * * *", "an empty list item"),
        ("0 0 30 2 *", "never fires"),
        ("@fortnightly", "not one of"),
        ("@every 0s", "longer than zero"),
        ("@every ten", "not a duration"),
    ],
)
def test_bad_expressions_are_refused_naming_the_field(expression: str, says: str) -> None:
    with pytest.raises(cron.CronError, match=says.replace("(", r"\(").replace(")", r"\)")):
        cron.parse(expression)
