"""Workplace checkpoint codec benchmark: export and restore N sessions after a few mutating calls.

Run: .venv/bin/python benchmarks/workplace_codec.py [--sessions 1000] [--seed 0]

Prints one table: encode and decode rates (single core, this process only), bytes per session for
the diff encoding and for the plain column-JSON encoding of the same sessions (ratio from this
run), the base size, and peak memory. Every restored session is checked to equal its original
exactly (values, dtypes, index, NaN vs None) outside the timed sections.
Targets (docs/architecture.md, "Targets"): <= 10 KB per typical session, >= 30x smaller than plain, >= 500 sessions/s.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import statistics
import sys
import time
import tracemalloc
from typing import Any

from gym_services.resources.workplace_assistant.codec import encode_plain
from gym_services.resources.workplace_assistant.compare import environment_differences
from gym_services.resources.workplace_assistant.environment import (
    CALENDAR,
    CRM,
    DIRECTORY,
    EMAILS,
    TASKS,
    pristine_tables,
)
from gym_services.resources.workplace_assistant.sessions import WorkplaceSessions

_WORDS = [
    "quarterly",
    "review",
    "budget",
    "prototype",
    "deadline",
    "launch",
    "customer",
    "update",
    "meeting",
    "sync",
    "roadmap",
    "design",
    "backend",
    "frontend",
    "release",
    "notes",
    "agenda",
    "follow-up",
    "report",
    "metrics",
    "onboarding",
]


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n)).capitalize() + "."


def _mutating_call(rng: random.Random, ids: dict[str, list[str]], people: list[str]) -> tuple[str, dict[str, Any]]:
    kind = rng.randrange(14)
    who = rng.choice(people)
    if kind == 0:
        return "email_send_email", {"recipient": who, "subject": _sentence(rng, 5), "body": _sentence(rng, 40)}
    if kind == 1:
        return "email_reply_email", {"email_id": rng.choice(ids["email"]), "body": _sentence(rng, 25)}
    if kind == 2:
        return "email_forward_email", {"email_id": rng.choice(ids["email"]), "recipient": who}
    if kind == 3:
        return "email_delete_email", {"email_id": rng.choice(ids["email"])}
    if kind == 4:
        start = f"2023-12-{rng.randint(1, 28):02d} {rng.randint(9, 16):02d}:00:00"
        return "calendar_create_event", {
            "event_name": _sentence(rng, 3),
            "participant_email": who,
            "event_start": start,
            "duration": rng.choice(["30", "60", "90"]),
        }
    if kind == 5:
        return "calendar_update_event", {
            "event_id": rng.choice(ids["event"]),
            "field": "event_name",
            "new_value": _sentence(rng, 3),
        }
    if kind == 6:
        return "calendar_delete_event", {"event_id": rng.choice(ids["event"])}
    if kind == 7:
        return "analytics_create_plot", {
            "time_min": "2023-11-01",
            "time_max": f"2023-11-{rng.randint(2, 30):02d}",
            "value_to_plot": rng.choice(["total_visits", "user_engaged", "visits_direct"]),
            "plot_type": rng.choice(["bar", "line"]),
        }
    if kind == 8:
        return "project_management_create_task", {
            "task_name": _sentence(rng, 4),
            "assigned_to_email": who,
            "list_name": "Backlog",
            "due_date": f"2023-12-{rng.randint(1, 28):02d}",
            "board": rng.choice(["Back end", "Design"]),
        }
    if kind == 9:
        return "project_management_update_task", {
            "task_id": rng.choice(ids["task"]),
            "field": "list_name",
            "new_value": "Completed",
        }
    if kind == 10:
        return "project_management_delete_task", {"task_id": rng.choice(ids["task"])}
    if kind == 11:
        return "customer_relationship_manager_add_customer", {
            "customer_name": _sentence(rng, 2),
            "assigned_to_email": who,
            "status": "Lead",
        }
    if kind == 12:
        return "customer_relationship_manager_update_customer", {
            "customer_id": rng.choice(ids["customer"]),
            "field": "status",
            "new_value": "Won",
        }
    return "customer_relationship_manager_delete_customer", {"customer_id": rng.choice(ids["customer"])}


def build_sessions(n: int, seed: int) -> WorkplaceSessions:
    """``n`` sessions, each after 2-5 mutating tool calls (and a read), chosen deterministically."""
    base = pristine_tables().tables
    ids = {
        "email": base[EMAILS]["email_id"].tolist(),
        "event": base[CALENDAR]["event_id"].tolist(),
        "task": base[TASKS]["task_id"].tolist(),
        "customer": base[CRM]["customer_id"].tolist(),
    }
    people = base[DIRECTORY]["email_address"].tolist()
    store = WorkplaceSessions()
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        sid = f"session-{i:05d}"
        store.seed(sid)
        store.call_tool(sid, "email_search_emails", {"query": rng.choice(_WORDS)})
        for _ in range(rng.randint(2, 5)):
            name, args = _mutating_call(rng, ids, people)
            store.call_tool(sid, name, args)
    return store


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def run(n: int, seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    store = build_sessions(n, seed)
    build_s = time.perf_counter() - t0
    store.export_session_states()  # warm the base view (digest, per-column arrays) once

    gc.collect()
    t0 = time.perf_counter()
    states = store.export_session_states()
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    records = {sid: _dumps(state) for sid, state in states.items()}
    dumps_s = time.perf_counter() - t0
    bases = {d: _dumps(b) for d, b in store.base_states().items()}

    loaded = {sid: json.loads(raw) for sid, raw in records.items()}
    loaded_bases = {d: json.loads(raw) for d, raw in bases.items()}
    fresh = WorkplaceSessions()
    gc.collect()
    t0 = time.perf_counter()
    fresh.restore_session_states(loaded, loaded_bases)
    decode_s = time.perf_counter() - t0

    exact = sum(1 for sid in store.session_ids() if not environment_differences(store.get(sid), fresh.get(sid)))

    t0 = time.perf_counter()
    plain_sizes = [len(_dumps(encode_plain(store.get(sid)))) for sid in store.session_ids()]
    plain_s = time.perf_counter() - t0

    tracemalloc.start()
    store.export_session_states()
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    sizes = sorted(len(r) for r in records.values())
    mean = statistics.fmean(sizes)
    plain_mean = statistics.fmean(plain_sizes)
    return {
        "sessions": n,
        "build (tool calls) s": build_s,
        "encode sessions/s": n / encode_s,
        "encode+json sessions/s": n / (encode_s + dumps_s),
        "decode sessions/s (validate+restore)": n / decode_s,
        "diff bytes/session mean": mean,
        "diff bytes/session p95": sizes[min(len(sizes) - 1, int(0.95 * len(sizes)))],
        "diff bytes/session max": sizes[-1],
        "plain bytes/session mean": plain_mean,
        "plain encode+json sessions/s": n / plain_s,
        "ratio plain/diff": plain_mean / mean,
        "base bytes (written once)": sum(len(b) for b in bases.values()),
        "restored exactly": f"{exact}/{n}",
        "peak RSS MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "export traced peak MiB": traced_peak / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000, help="Workplace sessions to encode (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sessions' random contents (default 0)")
    args = parser.parse_args(argv)
    result = run(args.sessions, args.seed)
    width = max(len(k) for k in result)
    print(f"| {'metric'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for key, value in result.items():
        text = f"{value:,.1f}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else value
        print(f"| {key.ljust(width)} | {text} |")
    ok = (
        result["diff bytes/session mean"] <= 10_000
        and result["ratio plain/diff"] >= 30
        and result["encode sessions/s"] >= 500
        and result["restored exactly"] == f"{args.sessions}/{args.sessions}"
    )
    print(f"targets (<=10 KB, >=30x, >=500/s, exact): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
