"""Inputs for the workplace_assistant conformance runs, and OUR side of each run.

Shared by ``test_workplace_assistant.py`` (CI) and ``benchmarks/conformance_workplace.py`` (longer
runs). The same steps go to the oracle (``oracle/glue_workplace_assistant.py``, NeMo Gym's modules)
and to our server through its real Starlette routes; answers are compared as status codes and exact
body bytes, and the final tables as columns, dtypes, index labels and exactly typed cells.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

from gym_services.base.sessions import SessionCodec
from gym_services.resources.workplace_assistant.app import Config, create_app
from gym_services.resources.workplace_assistant.environment import DATA_DIR, TABLE_KEYS
from tests.conformance import edge_cases as edge
from tests.conformance.http_cases import request_kwargs
from tests.conformance.oracle.glue_workplace_assistant import describe_table, table_digest
from tests.support.asgi import SECRET, base_config, serve

SERVER = "workplace_assistant"

# --------------------------------------------------------------------------- argument pools

FIELDS_EMAIL = ["email_id", "inbox/outbox", "sender/recipient", "subject", "sent_datetime", "body"]
FIELDS_EVENT = ["event_id", "event_name", "participant_email", "event_start", "duration"]
FIELDS_TASK = ["task_id", "task_name", "assigned_to_email", "list_name", "due_date", "board"]
FIELDS_CRM = [
    "customer_id",
    "customer_name",
    "customer_email",
    "customer_phone",
    "last_contact_date",
    "product_interest",
    "status",
    "assigned_to_email",
    "notes",
    "follow_up_by",
]
LISTS = ["Backlog", "In Progress", "In Review", "Completed"]
BOARDS = ["Back end", "Front end", "Design"]
STATUSES = ["Qualified", "Won", "Lost", "Lead", "Proposal"]
PRODUCTS = ["Software", "Hardware", "Services", "Consulting", "Training"]
METRICS = [
    "total_visits",
    "session_duration_seconds",
    "user_engaged",
    "visits_direct",
    "visits_referral",
    "visits_search_engine",
    "visits_social_media",
]
PLOTS = ["bar", "line", "scatter", "histogram"]
SOURCES = ["direct", "referral", "search engine", "social media"]

#: values of the wrong kind or shape a model sometimes sends
ODD = [0, 7, -1, 1.5, True, False, "", " ", [], ["x"], {}, {"a": 1}, "(", "[a-", ".*", "a+b", "\\", "ü—✓"]
DATES = [
    "2023-11-01",
    "2023-11-30",
    "2023-10-15",
    "2023-12-01",
    "2023-11",
    "2023",
    "11/20/2023",
    "November 20, 2023",
    "2023-11-20 10:00:00",
    "2023-11-20T10:00",
    "20231120",
    "2023-13-45",
    "bad",
    "2023-11-31",
    "tomorrow",
]
DATETIMES = [
    "2023-11-30 09:00:00",
    "2023-12-01 10:30:00",
    "2023-08-01 09:00:00",
    "2023-11-15",
    "2023-11-15 25:00:00",
    "2023-11-15T14:00:00",
    "Dec 4 2023 3pm",
    "bad",
    "2023-12-04 10:00",
    "2024-01-01 00:00:00",
]
QUERIES = [
    "",
    "update",
    "Task Update",
    "budget planning",
    "carlos",
    "santiago",
    "q4",
    "UPDATE on",
    "nomatch",
    "review",
    "sync",
    "meeting",
    "atlas",
    "luis",
    "(",
]
PAGES = [1, 1, 2, 3, 0, -1, 100]
PAGE_SIZES = [5, 5, 1, 3, 10, 50, 0, -2]


def _pick(rng: random.Random, pool: list, odd: float = 0.08) -> Any:
    """Mostly a value of ``pool``; sometimes an odd one, or an edge value (every JSON type, nested lists, lone
    surrogates, integers past 4,300 digits: ``edge_cases.edge_value``)."""
    r = rng.random()
    if r < odd * 0.6:
        return rng.choice(ODD)
    if r < odd:
        return edge.edge_value(rng)
    return rng.choice(pool)


class CallBuilder:
    """Random tool calls built from real table IDs and values (plus some odd ones)."""

    def __init__(self, ids: dict[str, list[str]]) -> None:
        self.ids = ids
        self.addresses = ids["address"]
        self.names = sorted({a.split("@")[0].split(".")[0] for a in self.addresses})

    def _id(self, rng: random.Random, kind: str) -> Any:
        r = rng.random()
        if r < 0.8:
            return rng.choice(self.ids[kind])
        if r < 0.9:
            return rng.choice(["00000000", "99999999", "500", "501", "1", "0000013", "00000013 ", "abc"])
        return rng.choice(ODD)

    def _address(self, rng: random.Random) -> Any:
        r = rng.random()
        if r < 0.75:
            a = rng.choice(self.addresses)
            return a.upper() if rng.random() < 0.15 else a
        return rng.choice(
            ["someone@example.com", "no-at-sign.com", "x@y", "raj.patel", "Raj.Patel@Atlas.com", "", *ODD[:6]]
        )

    def build(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        name = rng.choice(TOOL_NAMES)
        args = getattr(self, "_" + name)(rng)
        # sometimes: drop an argument, null one, add an unexpected one
        if args and rng.random() < 0.07:
            args.pop(rng.choice(list(args)))
        if args and rng.random() < 0.05:
            args[rng.choice(list(args))] = None
        if rng.random() < 0.03:
            args[rng.choice(["foo", "id", "limit", "query", edge.SURROGATE])] = rng.choice(["x", 1, None])
        if name.endswith(("_update_event", "_update_task", "_update_customer")) and rng.random() < 0.3:
            args["new_value"] = edge.edge_value(rng)  # a cell value of any JSON type
        return name, args

    # one generator per tool: mostly well-formed, sometimes odd
    def _company_directory_find_email_address(self, rng):
        return {"name": _pick(rng, [*self.names, "", "raj", "ZHANG", "a", "(", "x.y"])}

    def _email_get_email_information_by_id(self, rng):
        return {"email_id": self._id(rng, "email_id"), "field": _pick(rng, [*FIELDS_EMAIL, "sender", "date"])}

    def _search(self, rng, date_keys: tuple[str, str], dates: list) -> dict:
        args: dict[str, Any] = {}
        if rng.random() < 0.8:
            args["query"] = _pick(rng, QUERIES + self.names)
        for key in date_keys:
            if rng.random() < 0.3:
                args[key] = _pick(rng, dates)
        if rng.random() < 0.4:
            args["page"] = _pick(rng, PAGES, 0.05)
        if rng.random() < 0.4:
            args["page_size"] = _pick(rng, PAGE_SIZES, 0.05)
        return args

    def _email_search_emails(self, rng):
        return self._search(rng, ("date_min", "date_max"), DATES)

    def _email_send_email(self, rng):
        return {
            "recipient": self._address(rng),
            "subject": _pick(rng, ["Hello", "Q4 plan", "Re: budget", ""]),
            "body": _pick(rng, ["Thanks!", "See you at 10.", "Draft attached.", ""]),
        }

    def _email_delete_email(self, rng):
        return {"email_id": self._id(rng, "email_id")}

    def _email_forward_email(self, rng):
        return {"email_id": self._id(rng, "email_id"), "recipient": self._address(rng)}

    def _email_reply_email(self, rng):
        return {"email_id": self._id(rng, "email_id"), "body": _pick(rng, ["Thanks for the update.", "OK", ""])}

    def _calendar_get_event_information_by_id(self, rng):
        return {"event_id": self._id(rng, "event_id"), "field": _pick(rng, [*FIELDS_EVENT, "start", "participants"])}

    def _calendar_search_events(self, rng):
        return self._search(rng, ("time_min", "time_max"), DATETIMES + DATES[:4])

    def _calendar_create_event(self, rng):
        return {
            "event_name": _pick(rng, ["Budget sync", "1:1", "Design review", ""]),
            "participant_email": self._address(rng),
            "event_start": _pick(rng, DATETIMES),
            "duration": _pick(rng, ["30", "60", "90", 45, "0", "-15", "1.5", "half an hour", "15 "]),
        }

    def _calendar_delete_event(self, rng):
        return {"event_id": self._id(rng, "event_id")}

    def _calendar_update_event(self, rng):
        field = _pick(rng, [*FIELDS_EVENT, "location"])
        value = {
            "event_name": "Renamed",
            "participant_email": self._address(rng),
            "event_start": rng.choice(DATETIMES),
            "duration": rng.choice(["45", "0", "x", 30, "-5"]),
            "event_id": "00000001",
        }.get(field if isinstance(field, str) else "", "v")
        return {"event_id": self._id(rng, "event_id"), "field": field, "new_value": _pick(rng, [value])}

    def _time_range(self, rng) -> dict:
        args: dict[str, Any] = {}
        if rng.random() < 0.6:
            args["time_min"] = _pick(rng, DATES)
        if rng.random() < 0.6:
            args["time_max"] = _pick(rng, DATES)
        return args

    def _analytics_engaged_users_count(self, rng):
        return self._time_range(rng)

    def _analytics_get_visitor_information_by_id(self, rng):
        return {"visitor_id": self._id(rng, "visitor_id")}

    def _analytics_create_plot(self, rng):
        return {
            **self._time_range(rng),
            "value_to_plot": _pick(rng, [*METRICS, "visits"]),
            "plot_type": _pick(rng, [*PLOTS, "pie"]),
        }

    def _analytics_traffic_source_count(self, rng):
        args = self._time_range(rng)
        if rng.random() < 0.7:
            args["traffic_source"] = _pick(rng, [*SOURCES, "email"])
        return args

    def _analytics_total_visits_count(self, rng):
        return self._time_range(rng)

    def _analytics_get_average_session_duration(self, rng):
        return self._time_range(rng)

    def _project_management_get_task_information_by_id(self, rng):
        return {"task_id": self._id(rng, "task_id"), "field": _pick(rng, [*FIELDS_TASK, "owner"])}

    def _project_management_search_tasks(self, rng):
        pools = {
            "task_name": ["prototype", "Add", "carousel", "(", "API"],
            "assigned_to_email": None,
            "list_name": [*LISTS, "progress"],
            "due_date": ["2023-11-27", "2023-12", "11-27"],
            "board": [*BOARDS, "end"],
        }
        args: dict[str, Any] = {}
        for key, pool in pools.items():
            if rng.random() < 0.35:
                args[key] = self._address(rng) if pool is None else _pick(rng, pool)
        return args

    def _project_management_create_task(self, rng):
        return {
            "task_name": _pick(rng, ["Launch notes", "Fix login", ""]),
            "assigned_to_email": self._address(rng),
            "list_name": _pick(rng, [*LISTS, "Todo"]),
            "due_date": _pick(rng, DATES[:6]),
            "board": _pick(rng, [*BOARDS, "Ops"]),
        }

    def _project_management_delete_task(self, rng):
        return {"task_id": self._id(rng, "task_id")}

    def _project_management_update_task(self, rng):
        field = _pick(rng, [*FIELDS_TASK, "priority"])
        value = {
            "list_name": rng.choice([*LISTS, "Done"]),
            "board": rng.choice([*BOARDS, "QA"]),
            "assigned_to_email": self._address(rng),
            "task_id": "00000001",
            "due_date": "2023-12-24",
            "task_name": "Renamed task",
        }.get(field if isinstance(field, str) else "", "v")
        return {"task_id": self._id(rng, "task_id"), "field": field, "new_value": _pick(rng, [value])}

    def _customer_relationship_manager_search_customers(self, rng):
        pools = {
            "customer_name": ["Taylor", "quinn", "harris", "("],
            "customer_email": ["nanolabs", "@"],
            "product_interest": [*PRODUCTS, "soft"],
            "status": [*STATUSES, "won", "o"],
            "assigned_to_email": ["lena", "sofia.santos@atlas.com", "atlas"],
            "last_contact_date_min": DATES,
            "last_contact_date_max": DATES,
            "follow_up_by_min": DATES,
            "follow_up_by_max": DATES,
        }
        args: dict[str, Any] = {}
        for key, pool in pools.items():
            if rng.random() < 0.2:
                args[key] = _pick(rng, pool)
        if rng.random() < 0.3:
            args["page"] = _pick(rng, PAGES, 0.05)
        if rng.random() < 0.3:
            args["page_size"] = _pick(rng, PAGE_SIZES, 0.05)
        return args

    def _customer_relationship_manager_update_customer(self, rng):
        field = _pick(rng, [*FIELDS_CRM, "phone"])
        value = {
            "status": rng.choice([*STATUSES, "Closed"]),
            "product_interest": rng.choice([*PRODUCTS, "Cloud"]),
            "customer_email": "New@Example.com",
            "assigned_to_email": self._address(rng),
            "customer_phone": "555-0100",
            "customer_id": "00000001",
        }.get(field if isinstance(field, str) else "", "v")
        return {"customer_id": self._id(rng, "customer_id"), "field": field, "new_value": _pick(rng, [value])}

    def _customer_relationship_manager_add_customer(self, rng):
        args = {
            "customer_name": _pick(rng, ["Dakota Thomas", "Acme", ""]),
            "assigned_to_email": self._address(rng),
            "status": _pick(rng, [*STATUSES, "Closed"]),
        }
        for key, pool in {
            "customer_email": ["Dakota@Example.com"],
            "customer_phone": ["555-0101"],
            "last_contact_date": DATES[:3],
            "product_interest": PRODUCTS,
            "notes": ["met at expo", ""],
            "follow_up_by": DATES[:3],
        }.items():
            if rng.random() < 0.3:
                args[key] = _pick(rng, pool)
        return args

    def _customer_relationship_manager_delete_customer(self, rng):
        return {"customer_id": self._id(rng, "customer_id")}


def tool_names() -> list[str]:
    names = []
    for toolkit in (
        "company_directory",
        "email",
        "calendar",
        "analytics",
        "project_management",
        "customer_relationship_manager",
    ):
        names += [t["name"] for t in json.loads((DATA_DIR / "tools" / f"{toolkit}.json").read_text())["tools"]]
    return names


TOOL_NAMES = tool_names()


def tool_step(name: str, args: Any) -> dict:
    return {"op": "tool", "name": name, "body": edge.dumps(args)}


#: the update tools: (tool, id argument, a real id, the getter, a writable field)
UPDATERS = [
    ("calendar_update_event", "event_id", "00000013", "calendar_get_event_information_by_id", "event_name"),
    (
        "project_management_update_task",
        "task_id",
        "00000149",
        "project_management_get_task_information_by_id",
        "task_name",
    ),
    ("customer_relationship_manager_update_customer", "customer_id", "00000189", None, "status"),
]


def edge_sequences() -> list[list[dict]]:
    """The edge inputs that once differed, each in its own session so its final tables are compared:
    JSON values of every type written into a cell through the three update tools and read back (a nested list
    stays a list in NeMo Gym's one-block tables; ``[1, 2]`` fails with numpy's message), text that cannot be
    encoded (a lone surrogate echoed in an answer, or as a body key), and bodies nested past every JSON parser
    to every kind of route."""
    seq: list[list[dict]] = []
    for tool, id_arg, row, getter, field in UPDATERS:
        for value in [*edge.JSON_VALUES, edge.SURROGATE, edge.HUGE_INT]:
            steps = [{"op": "seed"}, tool_step(tool, {id_arg: row, "field": field, "new_value": value})]
            if getter:
                steps.append(tool_step(getter, {id_arg: row, "field": field}))
            else:
                steps.append(tool_step("customer_relationship_manager_search_customers", {"status": value}))
            seq.append(steps)
    s = edge.SURROGATE
    seq.append(
        [
            {"op": "seed"},
            tool_step("email_get_email_information_by_id", {"email_id": "00000057", "field": s}),
            tool_step("email_send_email", {"recipient": "raj.patel@atlas.com", "subject": s, "body": "b"}),
            tool_step("email_search_emails", {"query": s}),
            tool_step("email_search_emails", {"query": [s]}),
            tool_step("email_search_emails", {s: 1}),
            tool_step("email_search_emails", {"query": "x", "a" + s: 1}),
            tool_step("email_search_emails", {s: 1, "\udfff": 2}),
            tool_step("email_search_emails", {"q": {s: 1}}),
            tool_step("email_search_emails", {"\U0001f600": 1}),
            tool_step("email_search_emails", {"query": "update", "page_size": edge.HUGE_INT}),
        ]
    )
    seq.append(
        [
            {"op": "http", "call": {"path": path, "raw": edge.dumps({s: 1}), "content_type": "application/json"}}
            for path in ("/verify", "/seed_session")
        ]
        + [{"op": "seed"}, tool_step("email_search_emails", {s: 1})]
    )
    deep = [
        edge.deep_list(edge.TOO_DEEP),
        edge.deep_value(edge.TOO_DEEP, "email_id"),
        edge.deep_list(edge.SHALLOW),
        edge.deep_value(edge.SHALLOW, "email_id"),
    ]
    for steps in ([], [{"op": "seed"}]):
        seq.append(
            steps
            + [{"op": "tool", "name": "email_delete_email", "body": body} for body in deep]
            + [
                {"op": "http", "call": {"path": path, "raw": body, "content_type": "application/json"}}
                for path in ("/seed_session", "/verify", "/close_session")
                for body in deep[:2]
            ]
        )
    return seq


def python_depth_sequence() -> list[dict]:
    """The named gap ``PYTHON_DEPTH``: bodies nested :data:`edge.BETWEEN_PARSERS` levels, which NeMo Gym's Python
    (3.13) parses and ours (3.11) does not."""
    bodies = [edge.deep_list(edge.BETWEEN_PARSERS), edge.deep_value(edge.BETWEEN_PARSERS, "email_id")]
    return [{"op": "seed"}] + [{"op": "tool", "name": "email_delete_email", "body": body} for body in bodies]


def random_sequences(ids: dict, seed: int, count: int, lo: int = 2, hi: int = 8) -> list[list[dict]]:
    """``count`` sessions of ``lo``..``hi`` random calls each, reproducible from ``seed``."""
    rng = random.Random(seed)
    builder = CallBuilder(ids)
    out = []
    for _ in range(count):
        calls = [builder.build(rng) for _ in range(rng.randint(lo, hi))]
        out.append([{"op": "seed"}] + [tool_step(n, a) for n, a in calls])
    return out


def valid_call_sequences() -> list[list[dict]]:
    """Every tool with well-formed arguments, each in its own session (27 sessions)."""
    calls: dict[str, dict] = {
        "company_directory_find_email_address": {"name": "raj"},
        "email_get_email_information_by_id": {"email_id": "00000057", "field": "subject"},
        "email_search_emails": {
            "query": "Task Update",
            "date_min": "2023-10-01",
            "date_max": "2023-11-30",
            "page": 2,
            "page_size": 3,
        },
        "email_send_email": {"recipient": "Raj.Patel@atlas.com", "subject": "Q4 plan", "body": "Draft attached."},
        "email_delete_email": {"email_id": "00000259"},
        "email_forward_email": {"email_id": "00000057", "recipient": "nadia.moreau@atlas.com"},
        "email_reply_email": {"email_id": "00000057", "body": "Thanks - tomorrow."},
        "calendar_get_event_information_by_id": {"event_id": "00000013", "field": "event_start"},
        "calendar_search_events": {
            "query": "sync",
            "time_min": "2023-08-01 00:00:00",
            "time_max": "2023-12-31 23:59:59",
            "page": 1,
            "page_size": 10,
        },
        "calendar_create_event": {
            "event_name": "Budget sync",
            "participant_email": "Luis.Ortiz@atlas.com",
            "event_start": "2023-12-04 10:00:00",
            "duration": "30",
        },
        "calendar_delete_event": {"event_id": "00000013"},
        "calendar_update_event": {
            "event_id": "00000252",
            "field": "participant_email",
            "new_value": "Raj.Patel@atlas.com",
        },
        "analytics_engaged_users_count": {"time_min": "2023-11-01", "time_max": "2023-11-07"},
        "analytics_get_visitor_information_by_id": {"visitor_id": "0860"},
        "analytics_create_plot": {
            "time_min": "2023-11-01",
            "time_max": "2023-11-30",
            "value_to_plot": "user_engaged",
            "plot_type": "line",
        },
        "analytics_traffic_source_count": {
            "time_min": "2023-11-01",
            "time_max": "2023-11-05",
            "traffic_source": "direct",
        },
        "analytics_total_visits_count": {"time_min": "2023-11-20"},
        "analytics_get_average_session_duration": {"time_min": "2023-11-01", "time_max": "2023-11-10"},
        "project_management_get_task_information_by_id": {"task_id": "00000149", "field": "due_date"},
        "project_management_search_tasks": {"assigned_to_email": "Leila.Azizi@atlas.com", "board": "Front end"},
        "project_management_create_task": {
            "task_name": "Launch notes",
            "assigned_to_email": "leila.azizi@atlas.com",
            "list_name": "Backlog",
            "due_date": "2023-12-08",
            "board": "Design",
        },
        "project_management_delete_task": {"task_id": "00000037"},
        "project_management_update_task": {"task_id": "00000149", "field": "list_name", "new_value": "In Review"},
        "customer_relationship_manager_search_customers": {"status": "Won", "page_size": 3},
        "customer_relationship_manager_update_customer": {
            "customer_id": "00000189",
            "field": "status",
            "new_value": "Won",
        },
        "customer_relationship_manager_add_customer": {
            "customer_name": "Dakota Thomas",
            "assigned_to_email": "Nadia.Moreau@atlas.com",
            "status": "Lead",
        },
        "customer_relationship_manager_delete_customer": {"customer_id": "00000014"},
    }
    assert sorted(calls) == sorted(TOOL_NAMES), "every tool has a well-formed call"
    return [[{"op": "seed"}, tool_step(name, args)] for name, args in calls.items()]


def invalid_sequences() -> list[list[dict]]:
    """Bad bodies, unknown tools, unseeded sessions, unexpected and wrong-typed arguments."""
    seq: list[list[dict]] = []
    bodies = ["", "not json", "[1, 2]", '"text"', "3", "null", '{"email_id": ', "{}"]
    seq.append(
        [{"op": "seed"}]
        + [{"op": "tool", "name": "email_delete_email", "body": b} for b in bodies]
        + [
            {"op": "tool", "name": "email_delete_email", "body": '{"email_id": "1"}', "content_type": c}
            for c in (None, "text/plain", "application/merge-patch+json", "application/json; charset=utf-8")
        ]
    )
    seq.append(
        [
            {"op": "tool", "name": "email_delete_email", "body": '{"email_id": "00000259"}'},
            {"op": "tool", "name": "nope", "body": "{}"},
            {"op": "tool", "name": "nope", "body": "[]"},
        ]
    )
    seq.append(
        [
            {"op": "seed"},
            tool_step("no_such_tool", {}),
            tool_step("verify_me", {"x": 1}),
            tool_step("email_send_email", {"recipient": "a@b.c", "subject": "s", "body": "b", "cc": "x@y.z"}),
            tool_step("email_search_emails", {"query": 5}),
            tool_step("email_search_emails", {"page": "2"}),
            tool_step("email_search_emails", {"page_size": 0}),
            tool_step("email_search_emails", {"page": 99}),
            tool_step("calendar_search_events", {"query": "("}),
            tool_step("calendar_search_events", {"page": 0}),
            tool_step("calendar_search_events", {"time_min": "yesterday"}),
            tool_step("project_management_search_tasks", {"task_name": "["}),
            tool_step("customer_relationship_manager_search_customers", {"customer_name": "*"}),
            tool_step("company_directory_find_email_address", {"name": "("}),
            tool_step(
                "calendar_create_event",
                {"event_name": "x", "participant_email": "a@b.c", "event_start": "2023-12-01 10:00:00", "duration": 15},
            ),
            tool_step("calendar_update_event", {"event_id": 13, "field": "event_name", "new_value": "x"}),
            tool_step("email_get_email_information_by_id", {"email_id": ["00000057"], "field": "subject"}),
            tool_step(
                "project_management_update_task", {"task_id": "00000149", "field": "task_id", "new_value": "00000001"}
            ),
            tool_step(
                "customer_relationship_manager_add_customer",
                {"customer_name": "N", "status": "Lead", "assigned_to_email": "a@b.c", "notes": None},
            ),
            tool_step("analytics_get_average_session_duration", {}),
            tool_step("analytics_get_visitor_information_by_id", {"visitor_id": "0860"}),
            tool_step("analytics_traffic_source_count", {}),
            tool_step("email_send_email", {"recipient": "raj.patel@atlas.com", "subject": "s", "body": "b"}),
            tool_step("email_reply_email", {"email_id": "501", "body": "again"}),
            tool_step("email_search_emails", {"query": "again"}),
        ]
    )
    return seq


# --------------------------------------------------------------------------- our side


def make_app():
    app = create_app(Config.model_validate(base_config(SERVER)))
    return app


async def run_ours(app, steps: list[dict]) -> dict:
    """The same steps through our real routes, one cookie jar (= one session) per run."""
    answers: list[list] = []
    async with serve(app) as client:
        for step in steps:
            if step["op"] == "seed":
                resp = await client.post("/seed_session", content=b"{}", headers={"content-type": "application/json"})
            elif step["op"] == "tool":
                body = step.get("body")
                ctype = step.get("content_type", "application/json")
                resp = await client.post(
                    f"/{step['name']}", content=(body or "").encode(), headers={"content-type": ctype} if ctype else {}
                )
            elif step["op"] == "http":
                resp = await client.request(
                    step["call"].get("method", "POST"), step["call"]["path"], **request_kwargs(step["call"])
                )
            else:
                raise ValueError(step["op"])
            answers.append([resp.status_code, resp.text])
        sid = None
        cookie = client.cookies.get(f"gym_session_{SERVER}")
        if cookie:
            sid = SessionCodec(SECRET, SERVER).read(cookie)
    tables = None
    sessions = app.state.workplace_sessions
    if sid is not None and sid in sessions:
        env = sessions.get(sid)
        tables = {f"{c}.{a}": describe_table(env.get((c, a))) for c, a in TABLE_KEYS}
        sessions.drop(sid)
    return {"answers": answers, "tables": tables}


def differences(steps: list[dict], ref: dict, ours: dict, oracle=None) -> list[str]:
    """Every way ``ours`` differs from ``ref``: per answer (status, bytes) and per final table.

    ``ref`` may carry table digests only; on a mismatch the oracle is asked for the full tables."""
    out = []
    if ref["tables"] and ours["tables"] and any(isinstance(v, str) for v in ref["tables"].values()):
        mine = {k: table_digest(v) for k, v in ours["tables"].items()}
        if mine == ref["tables"]:
            ref, ours = {**ref, "tables": None}, {**ours, "tables": None}
        elif oracle is not None:
            ref = oracle.call("workplace_assistant", "run_sequence", steps, True)
        else:
            ref = {**ref, "tables": {k: {"digest": v} for k, v in ref["tables"].items()}}
    for i, (step, a, b) in enumerate(zip(steps, ref["answers"], ours["answers"], strict=True)):
        if a != b:
            what = step.get("name", step["op"]) + " " + str(step.get("body"))[:160]
            out.append(f"step {i} {what}: ref {a[0]} {a[1][:300]!r} | ours {b[0]} {b[1][:300]!r}")
    if (ref["tables"] is None) != (ours["tables"] is None):
        out.append(f"tables: ref {ref['tables'] is not None} ours {ours['tables'] is not None}")
    elif ref["tables"]:
        for key, table in ref["tables"].items():
            mine = ours["tables"].get(key)
            if mine != table:
                out.append(f"table {key}: " + _table_diff(table, mine))
    return out


def _table_diff(a: dict, b: dict | None) -> str:
    if b is None:
        return "missing"
    for part in ("columns", "dtypes", "index_type", "index_dtype", "index"):
        if a[part] != b[part]:
            return f"{part}: ref {str(a[part])[:200]} ours {str(b[part])[:200]}"
    if len(a["rows"]) != len(b["rows"]):
        return f"rows: ref {len(a['rows'])} ours {len(b['rows'])}"
    for i, (ra, rb) in enumerate(zip(a["rows"], b["rows"], strict=True)):
        if ra != rb:
            return f"row {i}: ref {ra} ours {rb}"
    return "?"


#: the known gap: NeMo Gym computes its run statistics here, ours answers 404 (see resources/common/nemo_routes.py)
AGGREGATE_METRICS = {"path": "/aggregate_metrics", "json": {"verify_responses": []}}


def route_sequences() -> list[list[dict]]:
    """The framework's routes, unknown paths and wrong methods, before and after a seed (one session)."""
    http = lambda **call: {"op": "http", "call": call}  # noqa: E731
    calls = [
        http(method="GET", path="/reverify_mode"),
        http(method="POST", path="/reverify_mode", json={}),
        http(path="/close_session", json={"resources_session_id": "s1", "episode_id": {"rollout_id": "r1"}}),
        http(
            path="/close_session", json={"resources_session_id": "s1", "episode_id": {"rollout_id": "r1", "attempt": 2}}
        ),
        http(path="/close_session", json={"resources_session_id": "s1", "episode_id": "e1"}),
        http(path="/close_session", json={"resources_session_id": "s1", "episode_id": {"rollout_id": "r1-a2"}}),
        http(path="/close_session", json={"resources_session_id": "s1", "episode_id": {"rollout_id": "r1"}, "x": 1}),
        http(path="/close_session", json={}),
        http(path="/close_session", raw="[]", content_type="application/json"),
        http(method="GET", path="/close_session"),
        http(method="GET", path="/tools"),
        http(method="GET", path="/email_search_emails"),
        http(method="PUT", path="/email_search_emails", json={}),
        http(method="GET", path="/verify"),
        http(method="GET", path="/seed_session"),
        http(path="/x/y", json={}),
        http(method="GET", path="/x/y"),
        *(http(method="GET", path=p) for p in ("/", "/health", "/healthz", "/livez", "/readyz")),
        http(method="DELETE", path="/healthz"),
    ]
    return [calls, [{"op": "seed"}, *calls, tool_step("email_search_emails", {"query": "update"})]]


def count_calls(sequences: Iterable[list[dict]]) -> int:
    """Requests compared: every seed and tool call."""
    return sum(len(steps) for steps in sequences)


# --------------------------------------------------------------------------- verify / reward


def _fc(i: int, name: str, arguments: str) -> dict:
    return {
        "type": "function_call",
        "name": name,
        "arguments": arguments,
        "call_id": f"call_{i}",
        "id": f"fc_{i}",
        "status": "completed",
    }


def _upper_values(arguments: str) -> str:
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return json.dumps({k: v.upper() if isinstance(v, str) else v for k, v in args.items()})


def _perturb(gt: list[dict], rng: random.Random) -> dict[str, list[dict]]:
    calls = [(c["name"], c["arguments"]) for c in gt]
    first_args = json.loads(calls[0][1]) if calls else {}
    variants: dict[str, list[tuple[str, str]]] = {
        "exact": calls,
        "empty": [],
        "drop_last": calls[:-1],
        "duplicate_first": calls[:1] + calls,
        "reversed": calls[::-1],
        "upper_case_values": [(n, _upper_values(a)) for n, a in calls],
        "null_argument": [(n, json.dumps({**json.loads(a), "notes": None})) for n, a in calls],
        "extra_argument": [(n, json.dumps({**json.loads(a), "cc": "x@y.z"})) for n, a in calls],
        "bad_json": [(n, a[:-1]) for n, a in calls],
        "unknown_tool": [("email_archive_email", "{}"), *calls],
        "read_only_added": [("email_search_emails", json.dumps({"query": "update"})), *calls],
        "int_argument": [(calls[0][0], json.dumps({k: 7 for k in first_args})), *calls[1:]] if calls else [],
        "side_effect_first": [("analytics_get_average_session_duration", "{}"), *calls],
        "random_value": [
            (
                n,
                json.dumps(
                    {k: rng.choice(["00000001", "Backlog", "x@atlas.com", "2023-12-01"]) for k in json.loads(a)}
                ),
            )
            for n, a in calls
        ],
    }
    return {k: [_fc(i, n, a) for i, (n, a) in enumerate(v)] for k, v in variants.items()}


def reward_cases(examples: list[dict], rollouts: list[dict], seed: int = 0) -> list[dict]:
    """Verify requests: the example tasks' ground truths against perturbed predictions, and the
    recorded rollouts' outputs against each task's ground truth. Each ``body`` is a full request as
    NeMo Gym's agent posts it (a recorded response object with the output swapped in)."""
    rng = random.Random(seed)
    template = rollouts[0]["response"]
    outputs: list[tuple[str, list[dict]]] = []
    cases = []

    def add(name: str, row: dict, output: list[dict], ground_truth: Any) -> None:
        body = {
            "responses_create_params": row["responses_create_params"],
            "response": {**template, "output": output},
            "ground_truth": ground_truth,
            "id": row["id"],
            "category": row["category"],
            "environment_name": row["environment_name"],
        }
        cases.append({"name": name, "body": body})

    for row in examples:
        for name, output in _perturb(row["ground_truth"], rng).items():
            add(f"task {row['id']} {name}", row, output, row["ground_truth"])
        add(
            f"task {row['id']} ground truth as text",
            row,
            _perturb(row["ground_truth"], rng)["exact"],
            json.dumps(row["ground_truth"]),
        )
    for i, rec in enumerate(rollouts):
        outputs.append((f"recorded rollout {i}", rec["response"]["output"]))
    for row in examples:
        for name, output in outputs:
            add(f"task {row['id']} vs {name}", row, output, row["ground_truth"])
    return cases


#: optional fields of a response object (the OpenAI SDK's ``Response``) a client may leave out
_OPTIONAL_RESPONSE_FIELDS = (
    "error",
    "incomplete_details",
    "instructions",
    "metadata",
    "temperature",
    "top_p",
    "background",
    "max_output_tokens",
    "previous_response_id",
    "reasoning",
    "service_tier",
    "status",
    "text",
    "truncation",
    "usage",
    "user",
    "prompt_cache_key",
    "safety_identifier",
)


def _partial(value: dict, rng: random.Random, optional: Iterable[str]) -> dict:
    return {k: v for k, v in value.items() if k not in optional or rng.random() < 0.5}


def partial_verify_cases(cases: list[dict], seed: int = 0) -> list[dict]:
    """The same requests with only some optional fields given (response fields, the function calls'
    ``id``/``status``, create params as a bare ``input``): the reference echoes both objects with
    every default filled in."""
    rng = random.Random(seed)
    out = []
    for case in cases:
        body = case["body"]
        response = _partial(body["response"], rng, _OPTIONAL_RESPONSE_FIELDS)
        response["output"] = [_partial(item, rng, ("id", "status")) for item in response["output"]]
        params = body["responses_create_params"]
        if rng.random() < 0.5:
            params = {"input": params.get("input", [])}
        out.append(
            {
                "name": case["name"] + " (partial)",
                "body": {**body, "response": response, "responses_create_params": params},
            }
        )
    return out


def invalid_verify_cases(template: dict) -> list[dict]:
    """Verify requests the reference refuses (422) or answers from odd fields."""
    good = template["body"]
    bodies = {
        "no id": {k: v for k, v in good.items() if k != "id"},
        "no category or environment": {k: v for k, v in good.items() if k not in ("category", "environment_name")},
        "id as text": {**good, "id": "seven"},
        "id as numeric text": {**good, "id": "7"},
        "no ground truth": {k: v for k, v in good.items() if k != "ground_truth"},
        "ground truth of numbers": {**good, "ground_truth": [{"name": 1}]},
        "response without output": {**good, "response": {k: v for k, v in good["response"].items() if k != "output"}},
        "response without id": {**good, "response": {k: v for k, v in good["response"].items() if k != "id"}},
        "create params with an unknown field": {**good, "responses_create_params": {"input": [], "nonsense": 1}},
        "create params without input": {**good, "responses_create_params": {}},
        "extra fields and failure fields": {
            **good,
            "mask_sample": True,
            "failure_kind": "x",
            "extra": [1, 2],
            "_ng_rollout_id": "r-1",
        },
        "a verdict field given": {**good, "reward": 0.5},
        "output item without type": {**good, "response": {**good["response"], "output": [{"name": "x"}]}},
        "function call with object arguments": {
            **good,
            "response": {
                **good["response"],
                "output": [
                    {"type": "function_call", "name": "email_send_email", "arguments": {"a": 1}, "call_id": "c"}
                ],
            },
        },
        # invalid values deeper inside the two Responses API objects
        "function call status wrong": {
            **good,
            "response": {
                **good["response"],
                "output": [{"type": "function_call", "name": "x", "arguments": "{}", "call_id": "c", "status": "ok"}],
            },
        },
        "message status wrong": {
            **good,
            "response": {
                **good["response"],
                "output": [{"id": "m", "type": "message", "role": "assistant", "status": "done", "content": []}],
            },
        },
        "reasoning without id": {
            **good,
            "response": {
                **good["response"],
                "output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]}],
            },
        },
        "output text without annotations": {
            **good,
            "response": {
                **good["response"],
                "output": [
                    {
                        "id": "m",
                        "type": "message",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": "t"}],
                    }
                ],
            },
        },
        "response reasoning effort wrong": {
            **good,
            "response": {**good["response"], "reasoning": {"effort": "extreme"}},
        },
        "response metadata not text": {**good, "response": {**good["response"], "metadata": {"a": 1}}},
        "response temperature text": {**good, "response": {**good["response"], "temperature": "hot"}},
        "response usage wrong": {**good, "response": {**good["response"], "usage": {"input_tokens": "x"}}},
        "create params streaming": {
            **good,
            "responses_create_params": {**good["responses_create_params"], "stream": True},
        },
        "create params truncation wrong": {
            **good,
            "responses_create_params": {**good["responses_create_params"], "truncation": "sometimes"},
        },
        "create params reasoning effort wrong": {
            **good,
            "responses_create_params": {**good["responses_create_params"], "reasoning": {"effort": "extreme"}},
        },
    }
    return [{"name": name, "body": body} for name, body in bodies.items()]


async def verify_ours(app, case: dict) -> list:
    """``[status, body text]`` from our ``/verify`` for one case (no seed: the answer does not use the session)."""
    async with serve(app) as client:
        resp = await client.post("/verify", json=case["body"])
    return [resp.status_code, resp.content.decode("utf-8", errors="replace")]
