"""Checkpoint pause, time to publish, bytes, restore and memory versus live Workplace sessions.

A real ``workplace_assistant`` uvicorn process holds N live sessions, each after a few mutating
tool calls. In one run, for each N and each storage (``file://`` and S3, a real SeaweedFS on
127.0.0.1), the same process takes:

- ``sync``: prepare -> capture -> persist -> publish -> resume: every record is encoded, packed and
  written while every rollout waits (at a location of its own, so it is a full checkpoint too);
- ``snapshot``: the default (prepare -> capture -> resume, then persist -> publish in the
  background: packed, incremental);
- ``snapshot+10%``: a second ``snapshot`` checkpoint after 10% of the sessions made one more
  mutating call (incremental: unchanged records are referenced, not rewritten).

Each checkpoint is then restored into a fresh process. Columns:

- pause: first prepare to last resume (what rollouts see), split into reaching boundaries
  (prepare), the snapshot (capture) and everything else (for ``sync``: the persist and the publication);
- published: from the first prepare until the global manifest is written;
- objects / written: what the checkpoint wrote (manifests included);
- restore: the restore transaction, wall clock, into a fresh process;
- peak/sessions: the server's peak RSS growth during the checkpoint over the sessions' own
  footprint (RSS after seeding minus RSS before), read from /proc.

    .venv/bin/python benchmarks/checkpoint_pause.py [--sessions 1000 4000 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gym_services.base.config import StorageConfig  # noqa: E402
from gym_services.control.protocol import CheckpointMethod  # noqa: E402
from gym_services.coordination.client import ControlClient, ParticipantRef  # noqa: E402
from gym_services.coordination.coordinator import Coordinator  # noqa: E402
from gym_services.stack.config import ServerSpec, StackConfig  # noqa: E402
from gym_services.stack.launcher import stack_secrets, start_stack, stop_stack  # noqa: E402
from tests.support.seaweed import start_seaweed  # noqa: E402

MUTATIONS = [
    ("email_send_email", {"recipient": "nadia.moreau@atlas.com", "subject": "Status", "body": "On track."}),
    ("calendar_create_event", {"event_name": "Sync", "participant_email": "nadia.moreau@atlas.com",
                               "event_start": "2023-12-01 10:00:00", "duration": "30"}),
    ("project_management_update_task", {"task_id": "00000000", "field": "list_name", "new_value": "Done"}),
]
CHANGE = ("email_send_email", {"recipient": "lena.schmidt@atlas.com", "subject": "Later", "body": "One more."})


@dataclass
class Row:
    sessions: int
    storage: str
    method: str
    boundaries: float
    snapshot: float
    other: float
    pause: float
    published: float
    records: int
    objects: int
    written: int
    reused: int
    restore: float = 0.0
    memory: float = 0.0


#: concurrent HTTP clients seeding and changing sessions; each keeps its connection (one client per
#: session spent most of the seeding time building TLS contexts and connections, not in the server)
CLIENTS = 4


async def _each_session(url: str, indexes: list[int], work) -> None:
    """Run ``work(client, i)`` for every index, on CLIENTS long-lived clients, sessions one after another on each."""
    todo = iter(indexes)

    async def worker() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            for i in todo:
                await work(client, i)

    await asyncio.gather(*(worker() for _ in range(CLIENTS)))


async def seed_sessions(url: str, n: int) -> list[dict[str, str]]:
    """N sessions after three mutating calls each, through the server's own routes; their cookies."""
    cookies: list[dict[str, str]] = [{} for _ in range(n)]

    async def one(client: httpx.AsyncClient, i: int) -> None:
        client.cookies.clear()  # a new session: the server sets its cookie
        ident = {"x-ng-rollout-id": f"r{i}", "x-ng-attempt": "0"}
        (await client.post("/seed_session", json={}, headers=ident)).raise_for_status()
        for name, args in MUTATIONS:
            (await client.post(f"/{name}", json=args, headers=ident)).raise_for_status()
        cookies[i] = dict(client.cookies)

    await _each_session(url, list(range(n)), one)
    if len({tuple(sorted(c.items())) for c in cookies}) != n:
        raise RuntimeError("sessions share a cookie: seeding did not create N sessions")
    return cookies


async def change_sessions(url: str, cookies: list[dict[str, str]], start: int, count: int) -> None:
    async def one(client: httpx.AsyncClient, i: int) -> None:
        client.cookies.clear()
        client.cookies.update(cookies[i])
        ident = {"x-ng-rollout-id": f"r{i}", "x-ng-attempt": "0"}
        (await client.post(f"/{CHANGE[0]}", json=CHANGE[1], headers=ident)).raise_for_status()

    await _each_session(url, [i % len(cookies) for i in range(start, start + count)], one)


async def transaction(url, token, location, storage, cid, *, restore=False, method=CheckpointMethod.SNAPSHOT):
    async with ControlClient(token, timeout_s=600) as client:
        coordinator = Coordinator([ParticipantRef("workplace", "resources", url)], client, storage_config=storage)
        if restore:
            return await coordinator.restore(cid, location, lease_s=300)
        return await coordinator.checkpoint(cid, location, prepare_timeout_s=60, lease_s=300, method=method)


def rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def reset_peak(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def checkpoint_row(n, backend, method_label, method, url, token, location, storage, cid, pid, footprint_kib) -> Row:
    reset_peak(pid)
    before = rss_kib(pid, "VmRSS")
    result = asyncio.run(transaction(url, token, location, storage, cid, method=method))
    assert result.status == "completed", result.error
    peak = rss_kib(pid, "VmHWM")
    t = result.timings
    snap = t.get("capture", 0.0)
    return Row(
        n, backend, method_label, t.get("prepare", 0.0), snap, result.pause_s - t.get("prepare", 0.0) - snap,
        result.pause_s, result.published_s or 0.0, result.records, result.objects, result.written_bytes,
        result.reused, memory=max(0, peak - before) / max(1, footprint_kib),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000, 4000, 10000],
                        help="live sessions to checkpoint, one row set per count (default 1000 4000 10000)")
    parser.add_argument("--storage", nargs="+", choices=["file", "s3"], default=["file", "s3"],
                        help="backends to measure: file:// and/or a local SeaweedFS (default both)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gymckpt-bench-"))
    s3 = start_seaweed(tmp / "seaweed")
    s3.create_bucket("bench")
    os.environ.update(s3.env())  # the server processes and boto3 here reach SeaweedFS through AWS_*
    storage = StorageConfig(endpoint_url=s3.endpoint)
    rows: list[Row] = []
    stack = StackConfig(name="bench", state_dir=str(tmp / "stack"),
                        servers={"workplace": ServerSpec(server="workplace_assistant")})
    token = stack_secrets(tmp / "stack")["control_token"]
    try:
        for n in args.sessions:
            todo: list[tuple[Row, str, str]] = []
            state = start_stack(stack, tmp, ready_timeout_s=120)
            url, pid = state.servers[0].url, state.servers[0].pid
            try:
                idle = rss_kib(pid, "VmRSS")
                t0 = time.perf_counter()
                cookies = asyncio.run(seed_sessions(url, n))
                print(f"{n} sessions seeded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
                live = httpx.get(f"{url}/ng-control/v1/checkpoint/status", headers={"authorization": f"Bearer {token}"},
                                 timeout=30).json()["live"]
                if live.get("sessions") != n:
                    raise RuntimeError(f"the server holds {live} after seeding {n} sessions")
                footprint = rss_kib(pid, "VmRSS") - idle
                changed = 0
                for backend in args.storage:
                    location = f"file://{tmp / 'store'}" if backend == "file" else f"s3://bench/n{n}"
                    for label, method in (("sync", CheckpointMethod.SYNC), ("snapshot", CheckpointMethod.SNAPSHOT)):
                        cid = f"{backend}-{n}-{label}"
                        # each method at its own location: a server reuses records only of its checkpoints there
                        where = f"{location}-sync" if method is CheckpointMethod.SYNC else location
                        row = checkpoint_row(n, backend, label, method, url, token, where, storage, cid, pid, footprint)
                        rows.append(row)
                        todo.append((row, where, cid))
                    asyncio.run(change_sessions(url, cookies, changed, n // 10))
                    changed += n // 10
                    cid = f"{backend}-{n}-incremental"
                    row = checkpoint_row(n, backend, "snapshot+10%", CheckpointMethod.SNAPSHOT, url, token, location,
                                         storage, cid, pid, footprint)
                    rows.append(row)
                    todo.append((row, location, cid))
                    print(f"{n} sessions on {backend}: checkpoints taken", file=sys.stderr)
            finally:
                stop_stack(tmp / "stack", kill=True)
            for row, location, cid in todo:
                state = start_stack(stack, tmp, ready_timeout_s=120)
                try:
                    t0 = time.perf_counter()
                    restored = asyncio.run(transaction(state.servers[0].url, token, location, storage, cid, restore=True))
                    row.restore = time.perf_counter() - t0
                    assert restored.status == "completed", restored.error
                    assert restored.records == row.records, (restored.records, row.records)
                finally:
                    stop_stack(tmp / "stack", kill=True)
            if n != args.sessions[-1]:
                print_table(rows, final=False)  # so far (a long run that is stopped still leaves its tables)
                print(flush=True)
    finally:
        s3.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(rows)


def print_table(rows: list[Row], final: bool = True) -> None:
    print("checkpoint of N live Workplace sessions (3 mutating calls each): sync vs snapshot, one run"
          + ("" if final else " (so far)"))
    head = (f"{'sessions':>8} {'storage':>7} {'method':>12} {'pause ms':>9} {'bound ms':>9} {'snap ms':>8} {'other ms':>9} "
            f"{'publish s':>9} {'records':>7} {'objects':>7} {'written':>10} {'reused':>6} {'restore s':>9} {'peak/sess':>9}")
    print(head)
    for r in rows:
        print(f"{r.sessions:>8} {r.storage:>7} {r.method:>12} {r.pause * 1e3:>9.1f} {r.boundaries * 1e3:>9.1f} "
              f"{r.snapshot * 1e3:>8.1f} {r.other * 1e3:>9.1f} {r.published:>9.3f} {r.records:>7} {r.objects:>7} "
              f"{r.written:>10} {r.reused:>6} {r.restore:>9.3f} {r.memory:>9.2f}")
    print()
    print("ratios in this run (snapshot vs sync; incremental vs the full snapshot before it):")
    by = {(r.sessions, r.storage, r.method): r for r in rows}
    sizes = sorted({r.sessions for r in rows})
    for (n, backend, method), r in sorted(by.items()):
        if method != "snapshot":
            continue
        sync, inc = by.get((n, backend, "sync")), by.get((n, backend, "snapshot+10%"))
        parts = []
        if sync:
            parts.append(f"pause {r.pause / sync.pause:.3f}x sync")
        if inc:
            parts.append(f"incremental writes {inc.written / max(1, r.written):.1%} of the bytes, "
                         f"{inc.objects / max(1, r.objects):.1%} of the objects")
        print(f"  {n:>6} {backend:>4}: " + "; ".join(parts))
    for backend in sorted({r.storage for r in rows}):
        for method in ("sync", "snapshot"):
            pts = [(n, by[(n, backend, method)].pause) for n in sizes if (n, backend, method) in by]
            if len(pts) >= 2:
                (n0, p0), (n1, p1) = pts[0], pts[-1]
                print(f"  extra pause per session, {backend} {method}: {(p1 - p0) / (n1 - n0) * 1e6:.1f} us "
                      f"({n0} -> {n1} sessions)")
    print("targets (issue 14): snapshot pause <= 150 ms at 1,000 and <= 1 s at 10,000 on S3, file no worse; "
          "<= 50 us per added session; published <= 2 s at 1,000 and <= 10 s at 10,000 on S3; incremental "
          "<= 15% of bytes and objects; restore from S3 <= 1 s at 1,000 and <= 5 s at 10,000; peak <= 1.5x")


if __name__ == "__main__":
    main()
