"""What a full garbage collection costs the serving process while an encoding child it forked is alive.

A process holds N live Workplace sessions (each after the pause benchmark's three mutating calls), then times one
``gc.collect()`` (CPU time of this process, so the machine's load stretches only the wall clock) in three
situations, alternately: no child; a forked child alive (every page is shared with it, so each page the
collection writes, an object's header, is copied first: a page fault per page); a child alive with the heap frozen
from the collector first (``gc.freeze()``, as ``gym_services.control.encoding`` does around its children). The
wall time is printed too: it is what a request waits when the collection runs on the serving thread.

    .venv/bin/python benchmarks/fork_collect.py [--sessions 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from checkpoint_pause import MUTATIONS  # noqa: E402

from gym_services.resources.workplace_assistant.sessions import WorkplaceSessions  # noqa: E402


def collect(situation: str) -> tuple[float, float]:
    """(CPU s, wall s) of one full collection in this process."""
    child = 0
    if situation != "no child":
        if situation == "child, heap frozen":
            gc.freeze()
        child = os.fork()
        if child == 0:  # stands in for an encoding child: alive, sharing every page, writing none
            signal.pause()
            os._exit(0)
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        gc.collect()
        return time.process_time() - c0, time.perf_counter() - t0
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        gc.unfreeze()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=3000, help="live Workplace sessions (default 3000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the three situations")
    args = parser.parse_args()
    store = WorkplaceSessions()
    for i in range(args.sessions):
        store.seed(f"s{i}")
        for name, body in MUTATIONS:
            store.call_tool(f"s{i}", name, body)
    gc.collect()
    situations = ["no child", "child alive", "child, heap frozen"]
    runs: dict[str, list[tuple[float, float]]] = {s: [] for s in situations}
    for _ in range(args.rounds):
        for situation in situations:
            runs[situation].append(collect(situation))
    with open("/proc/self/status") as status:
        rss = int(next(line for line in status if line.startswith("VmRSS")).split()[1]) // 1024
    print(
        f"one full gc.collect() in a process of {args.sessions} Workplace sessions ({len(gc.get_objects()):,} "
        f"tracked objects, RSS {rss} MiB), medians of {args.rounds}, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'situation':>20} {'CPU ms':>8} {'wall ms':>8}")
    for situation, figures in runs.items():
        cpu = statistics.median(c for c, _ in figures)
        wall = statistics.median(w for _, w in figures)
        print(f"{situation:>20} {cpu * 1e3:>8.1f} {wall * 1e3:>8.1f}")


if __name__ == "__main__":
    main()
