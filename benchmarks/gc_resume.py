"""Which cyclic garbage collections the serving process runs around a checkpoint's resume, and how long each takes.

Runs ``checkpoint_pause.py``'s stack (a real ``workplace_assistant`` uvicorn process holding N live sessions under
``--clients`` live HTTP clients, a cold and a warm ``background`` checkpoint to ``file://``) with a ``sitecustomize``
on the servers' path that records every collection through ``gc.callbacks`` (generation, start on the monotonic
clock the benchmark's windows use, wall duration) in a file per process. Each checkpoint's collections are then
put in windows of its transaction: under the pause (first prepare to last resume), the first second after resume
(when the parked calls retry and the persist forks), the rest of the background persist, and the 5 s after publish.
Per window: collections per generation, and for generation 2 (a walk of every tracked object) the longest and the
total. The longest collections near resume are listed with their offset from it.

With ``--in-process`` it shows instead what one capture costs the calls right after resume when it tips the
collector into a full collection (a capture keeps ~3 tracked objects per session, the heap holds ~85, and a full
collection runs once the objects promoted since the last one exceed a quarter of the heap: a capture tips it when
they were within that margin). In this process: N Workplace sessions, the promotion counter pushed to just below
the threshold, a capture as the control plane takes it (``collection_paused``: ``old`` re-enables collection;
``new`` freezes the heap first, as ``plane.py`` does now, until the "persist" ends), then 2,000 tool calls timed
as the first calls after resume.

    .venv/bin/python benchmarks/gc_resume.py [--sessions 10000] [--clients 8]
    .venv/bin/python benchmarks/gc_resume.py --in-process [--sessions 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from checkpoint_pause import MUTATIONS, READ, one_stack  # noqa: E402

from gym_services.base.config import StorageConfig  # noqa: E402

#: installed in every Python process the stack starts (through PYTHONPATH): one line per collection
TRACER = """
import gc, os, time

_dir = os.environ.get("GYMCKPT_GC_TRACE")
if _dir:
    _out = open(os.path.join(_dir, f"{os.getpid()}.log"), "a", buffering=1)
    _started = [0.0]

    def _trace(phase, info):
        if phase == "start":
            _started[0] = time.monotonic()
        else:
            _out.write(f"{info['generation']} {_started[0]:.6f} {time.monotonic() - _started[0]:.6f}\\n")

    gc.callbacks.append(_trace)
"""

WINDOWS = ("pause", "resume +1 s", "persist", "publish +5 s")


def windows(window: dict[str, float]) -> dict[str, tuple[float, float]]:
    paused, resumed, published = window["paused"], window["resumed"], window["published"]
    return {
        "pause": (paused, resumed),
        "resume +1 s": (resumed, resumed + 1.0),
        "persist": (resumed + 1.0, max(published, resumed + 1.0)),
        "publish +5 s": (max(published, resumed + 1.0), max(published, resumed + 1.0) + 5.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10000, help="live Workplace sessions (default 10000)")
    parser.add_argument("--clients", type=int, default=8, help="live clients calling tools throughout (default 8)")
    parser.add_argument("--before", type=float, default=5.0, help="seconds of calls before each checkpoint (p99)")
    parser.add_argument("--in-process", action="store_true", help="the worst case in this process, old and new way")
    args = parser.parse_args()
    if args.in_process:
        in_process(args.sessions)
        return
    tmp = Path(tempfile.mkdtemp(prefix="gymckpt-gc-"))
    trace = tmp / "trace"
    trace.mkdir()
    site = tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(TRACER)
    os.environ["GYMCKPT_GC_TRACE"] = str(trace)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    load = os.getloadavg()[0]
    try:
        pids: list[int] = []
        done = one_stack(args.sessions, "file", args, tmp, StorageConfig(), pids)
        log = trace / f"{pids[0]}.log"
        events = [(int(g), float(s), float(d)) for g, s, d in (line.split() for line in log.read_text().splitlines())]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"collections in the serving process ({args.sessions} Workplace sessions, file://, {args.clients} clients; "
        f"load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at end)"
    )
    print(
        f"{'start':>5} {'pause ms':>8} {'worst call ms':>13} {'p99 before ms':>13} {'window':>13} "
        f"{'gen0':>5} {'gen1':>5} {'gen2':>5} {'gen2 max ms':>11} {'gen2 sum ms':>11}"
    )
    longest: list[str] = []
    fulls: list[str] = []
    persist: list[str] = []
    for row, _, _ in done:
        for name, (lo, hi) in windows(row.window).items():
            inside = [e for e in events if lo <= e[1] < hi]
            full = [d for g, _, d in inside if g == 2]
            counts = [sum(1 for g, _, _ in inside if g == k) for k in range(3)]
            print(
                f"{row.start:>5} {row.pause * 1e3:>8.0f} {row.worst * 1e3:>13.0f} {row.p99_before * 1e3:>13.0f} "
                f"{name:>13} {counts[0]:>5} {counts[1]:>5} {counts[2]:>5} "
                f"{max(full, default=0) * 1e3:>11.1f} {sum(full) * 1e3:>11.1f}"
            )
        resumed, published = row.window["resumed"], row.window["published"]
        near = [e for e in events if row.window["paused"] - 1.0 <= e[1] < resumed + 2.0]
        for g, s, d in sorted(near, key=lambda e: -e[2])[:3]:
            longest.append(f"{row.start:>5}: gen{g} {d * 1e3:.1f} ms at resume {s - resumed:+.3f} s")
        for g, s, d in events:
            if g == 2 and row.window["paused"] - 5.0 <= s < published + 5.0:
                fulls.append(
                    f"{row.start:>5}: {d * 1e3:.1f} ms at resume {s - resumed:+.3f} s (publish {s - published:+.3f} s)"
                )
        persist.append(f"{row.start:>5}: {row.p99_persist * 1e3:.0f} ms over {row.persist_calls} calls")
    print("longest collections from 1 s before the pause to 2 s after resume:")
    print("\n".join(longest))
    print("every generation-2 collection from 5 s before the pause to 5 s after publish:")
    print("\n".join(fulls) or "none")
    print("clients' p99 from resume to publish:")
    print("\n".join(persist))


def in_process(n: int) -> None:
    # imported here: the trace mode also runs with an older tree first on PYTHONPATH (its servers and clients)
    from gym_services.control.encoding import HeapHold
    from gym_services.control.gc_pause import collection_paused
    from gym_services.control.participant import Scope
    from gym_services.resources.common.participant import ExportedParticipant
    from gym_services.resources.workplace_assistant.sessions import WorkplaceSessions

    store = WorkplaceSessions()
    for i in range(n):
        store.seed(f"s{i}")
        for name, body in MUTATIONS:
            store.call_tool(f"s{i}", name, body)
    participant = ExportedParticipant(store)
    events: list[tuple[int, float]] = []
    started = [0.0]

    def trace(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            events.append((info["generation"], time.perf_counter() - started[0]))

    print(
        f"the first 2,000 tool calls after a capture that tips a full collection, {n} Workplace sessions in this "
        f"process, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'way':>4} {'tracked objects':>15} {'gen2':>5} {'gen2 max ms':>11} {'worst call ms':>13} {'calls s':>8}")
    for way in ("old", "new", "old", "new"):
        gc.collect()  # the promotion counter at zero, the heap's size as the threshold's base
        heap = len(gc.get_objects())
        kept = [[] for _ in range(heap // 4 - 2 * n)]  # promoted: just under a quarter of the heap
        for _ in range(11):  # and ten partial collections since the last full one (the other condition)
            gc.collect(1)
        with collection_paused():
            capture = asyncio.run(participant.capture(Scope.of(None)))
            hold = HeapHold() if way == "new" else None
        events.clear()
        gc.callbacks.append(trace)
        worst, t0 = 0.0, time.perf_counter()
        try:
            for k in range(2000):
                c0 = time.perf_counter()
                store.call_tool(f"s{k % n}", *READ)
                worst = max(worst, time.perf_counter() - c0)
        finally:
            gc.callbacks.remove(trace)
            if hold is not None:
                hold.release()  # the persist ended
        took = time.perf_counter() - t0
        full = [d for g, d in events if g == 2]
        print(
            f"{way:>4} {heap:>15,} {len(full):>5} {max(full, default=0) * 1e3:>11.1f} {worst * 1e3:>13.1f} {took:>8.2f}"
        )
        del kept, capture


if __name__ == "__main__":
    main()
